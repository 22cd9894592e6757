"""Simulators (top floor): may import any service."""
