"""The brain's HTTP routes (issue 7): ``GET/POST /v1/jobs``, ``GET/DELETE /v1/jobs/<id>``,
``GET /v1/jobs/<id>/recovery`` (see :mod:`clusterd.brain.component`; the web's job page reads both
through :meth:`JobsHttp.page`) and the operator undo
``POST /v1/jobs/<id>/recovery/reset`` (``{"reevaluate": true}`` optional), platform mode's
``GET`` / ``POST /v1/jobs/<id>/platform`` (:mod:`clusterd.brain.platform`). The bearer token of the
mutating ones is checked by :mod:`clusterd.auth`'s middleware.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from clusterd.brain.jobs import JobSpecError, parse_jobs_text
from faultmesh.config import MAX_YAML_BYTES, parse_untrusted
from faultmesh.httpd import found_or_404, json_response
from faultmesh.log import event

if TYPE_CHECKING:
    from clusterd.brain.decisions import DecisionLog
    from clusterd.brain.jobs import JobRegistry
    from clusterd.brain.platform import PlatformAnnotations
    from clusterd.brain.registry import RecoveryRegistry

log = logging.getLogger("clusterd.brain")


class JobsHttp:
    """The job routes over the job registry ``jobs``, the recovery ``registry`` (controllers),
    the ``decisions`` log and the ``platform`` annotations; ``job_view(job, detail)`` renders a job
    with its health and faults, ``decide(job_id, flow, decision, reason)`` records a decision,
    ``evaluate(job)`` looks at a job's faults again, ``reject(reason)``
    counts a refused request."""

    def __init__(
        self,
        jobs: JobRegistry,
        registry: RecoveryRegistry,
        decisions: DecisionLog,
        platform: PlatformAnnotations,
        job_view: Callable[..., dict[str, Any]],
        decide: Callable[..., Any],
        evaluate: Callable[[Any], Any],
        reject: Callable[[str], None],
    ) -> None:
        self.jobs = jobs
        self.registry = registry
        self.decisions = decisions
        self.platform = platform
        self.job_view = job_view
        self.decide = decide
        self.evaluate = evaluate
        self.reject = reject

    def add_routes(self, r: web.UrlDispatcher) -> None:
        """Register the routes of the module docstring."""
        r.add_get("/v1/jobs", self._http_list)
        r.add_post("/v1/jobs", self._http_apply)
        r.add_get("/v1/jobs/{id}", self._http_get)
        r.add_delete("/v1/jobs/{id}", self._http_delete)
        r.add_get("/v1/jobs/{id}/recovery", self._http_recovery)
        r.add_post("/v1/jobs/{id}/recovery/reset", self._http_reset)
        r.add_get("/v1/jobs/{id}/platform", self._http_platform)
        r.add_post("/v1/jobs/{id}/platform", self._http_platform_set)

    async def _http_list(self, request: web.Request) -> web.Response:
        return json_response([self.job_view(j) for j in self.jobs.all()])

    async def _http_apply(self, request: web.Request) -> web.Response:
        try:
            raw = (await request.read()).decode("utf-8")
        except UnicodeDecodeError:
            self.reject("bad_job_spec")
            return json_response({"error": "body is not valid UTF-8"}, status=400)
        try:
            jobs = await parse_untrusted(parse_jobs_text, raw, MAX_YAML_BYTES)  # off the loop, one at a time
            results = await self.jobs.apply(jobs)
        except JobSpecError as e:
            self.reject("bad_job_spec")
            return json_response({"error": str(e)}, status=400)
        out = []
        for job, what in results:
            event(log, logging.INFO, f"job {what}", job=job.id, name=job.ns_name, ranks=len(job.ranks))
            out.append({"id": job.id, "name": job.name, "namespace": job.namespace, "result": what})
        return json_response(out)

    async def _http_get(self, request: web.Request) -> web.Response:
        jid = request.match_info["id"]
        return found_or_404(self.detail(jid), f"job {jid} not found")

    async def _http_delete(self, request: web.Request) -> web.Response:
        job = await self.jobs.delete(request.match_info["id"])
        if job is None:
            return json_response({"error": f"job {request.match_info['id']} not found"}, status=404)
        event(log, logging.INFO, "job deleted", job=job.id, name=job.ns_name)
        return json_response({"id": job.id, "result": "deleted"})

    def detail(self, jid: str) -> dict[str, Any] | None:
        """The ``GET /v1/jobs/<id>`` object of job ``jid``, or None for an unknown job."""
        job = self.jobs.get(jid)
        return None if job is None else self.job_view(job, detail=True)

    def page(self, jid: str) -> dict[str, Any] | None:
        """The brain's part of the web's job page (:mod:`clusterd.http.jobview`): ``{"job":
        <detail>, "recovery": <recovery>}``, or None for an unknown job."""
        detail = self.detail(jid)
        return None if detail is None else {"job": detail, "recovery": self.recovery(jid)}

    def recovery(self, jid: str) -> dict[str, Any] | None:
        """The ``GET /v1/jobs/<id>/recovery`` object: the controller's state and flow, whether a
        Recover client registered and subscribed, the strategies, the cached faults and the
        decisions; None for a job that is neither known nor has decisions."""
        job = self.jobs.get(jid)
        if job is None and jid not in self.decisions.decisions:
            return None
        ctl = self.registry.get(jid)
        return {
            "job_id": jid,
            "state": ctl.state if ctl else "",
            "flow": ctl.st.flow_name if ctl else "",
            "registered": ctl is not None,
            "subscribed": bool(ctl and ctl.subscribed),
            "strategies": job.strategies() if job else [],
            "sub_healthy_strategy": job.sub_healthy_strategy if job else "",
            "cached_faults": [f.as_dict() for f in ctl.cached_faults.values()] if ctl else [],
            "decisions": list(self.decisions.decisions.get(jid, ())),
        }

    async def _http_recovery(self, request: web.Request) -> web.Response:
        jid = request.match_info["id"]
        return found_or_404(self.recovery(jid), f"job {jid} not found")

    async def _http_reset(self, request: web.Request) -> web.Response:
        """Operator undo of the brain's recovery state: the running flow is cancelled, the cached
        faults dropped, a paused process-recover-enable set back to ``on``. With ``reevaluate``
        the job's current faults are looked at again as new (they may start a new flow).
        404 unknown or unregistered job."""
        jid = request.match_info["id"]
        ctl = self.registry.get(jid)
        job = self.jobs.get(jid)
        if ctl is None or job is None:
            return json_response({"error": f"job {jid} not found or not registered"}, status=404)
        try:
            body = orjson.loads(await request.read() or b"{}")
        except ValueError:
            return json_response({"error": "body is not JSON"}, status=400)
        was = ctl.state
        await ctl.reset("operator reset")
        if job.process_recover_enable == "pause":
            await self.jobs.update(jid, process_recover_enable="on")
        self.decide(jid, "operator", "operator-reset", f"recovery state cleared (was {was})")
        if isinstance(body, dict) and body.get("reevaluate"):
            ctl.st.seen_fault_keys = set()
            self.evaluate(self.jobs.get(jid))
        event(log, logging.INFO, "recovery reset by operator", job=jid, state=was)
        return json_response({"job_id": jid, "result": "reset", "was": was, "state": ctl.state})

    async def _http_platform(self, request: web.Request) -> web.Response:
        """Platform mode's annotations of a job (:mod:`clusterd.brain.platform`). 404 unknown job."""
        jid = request.match_info["id"]
        if self.jobs.get(jid) is None:
            return json_response({"error": f"job {jid} not found"}, status=404)
        return json_response(self.platform.get(jid))

    async def _http_platform_set(self, request: web.Request) -> web.Response:
        """The AI platform sets annotations: body ``{key: value | null}``. 400 bad body or key,
        404 unknown job; answers the annotations after the change."""
        jid = request.match_info["id"]
        if self.jobs.get(jid) is None:
            return json_response({"error": f"job {jid} not found"}, status=404)
        try:
            body = orjson.loads(await request.read() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object {key: value | null}")
            await self.platform.patch(jid, body)
        except ValueError as e:  # orjson.JSONDecodeError is a ValueError
            self.reject("bad_platform_annotation")
            return json_response({"error": str(e)}, status=400)
        event(log, logging.INFO, "platform annotations set", job=jid, keys=",".join(sorted(body)))
        return json_response(self.platform.get(jid))
