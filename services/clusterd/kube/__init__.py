"""clusterd's Kubernetes mode: publish and consume the reference's ConfigMaps (see :mod:`.component`)."""

from clusterd.kube.component import KubeComponent

__all__ = ["KubeComponent"]
