"""FastAPI status endpoint: /healthz, /status (JSON), /metrics (Prometheus)."""

from __future__ import annotations

import re
import time

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from services.common.queue import WorkQueue

from .alerts import ALERT_KEYS
from .metrics import ASYNC_KEYS, EVAL_KEYS, STEP_KEYS
from .state import RunState


def prometheus_name(key: str) -> str:
    return "grpo_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)  # eval/pass@k -> grpo_eval_pass_k


def make_app(state: RunState, queue: WorkQueue) -> FastAPI:
    app = FastAPI(title="GRPO coordinator")
    registry = CollectorRegistry()
    gauges = {k: Gauge(prometheus_name(k), f"last step's {k}", registry=registry) for k in STEP_KEYS + ASYNC_KEYS}
    gauges |= {k: Gauge(prometheus_name(k), f"latest evaluation's {k}", registry=registry) for k in EVAL_KEYS}
    gauges |= {
        k: Gauge(prometheus_name(k), f"1 while {k} fires (collapse warning)", registry=registry) for k in ALERT_KEYS
    }
    depth = Gauge("grpo_queue_depth", "entries per Redis stream", ["stream"], registry=registry)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        try:
            queue.r.ping()
        except Exception as e:
            return JSONResponse({"ok": False, "redis": str(e)}, status_code=503)
        return JSONResponse({"ok": True})

    @app.get("/status")
    def status() -> dict:
        now = time.time()
        workers = {w: {**v, "age_s": now - v["ts"]} for w, v in queue.workers().items()}
        return {**state.to_json(), "queues": queue.depths(), "workers": workers}

    @app.get("/metrics")
    def metrics() -> Response:
        status = state.to_json()
        last = {**status["last_metrics"], **status["last_eval"]}
        for k, g in gauges.items():
            if k in last:
                g.set(last[k])
        for stream, n in queue.depths().items():
            depth.labels(stream).set(n)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
