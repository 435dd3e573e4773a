"""The dashboard server over real HTTP: authentication, no path traversal, bounded reads, and
Prometheus text whose values equal the run's."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from observe.conftest import Served
from polar_hpc.shards import iter_trajectories

pytestmark = pytest.mark.timeout(900)


def get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_every_api_needs_the_token(finished_dashboard: Served) -> None:
    d = finished_dashboard
    for path in ("/api/overview", "/api/series", "/api/errors", "/api/trajectories", "/api/trajectory/0", "/metrics"):
        assert get(d.base + path)[0] == 401
        assert get(d.base + path, "wrong" + d.token)[0] == 401
        assert get(d.base + path, d.token)[0] == 200, path
    assert get(f"{d.base}/api/overview?token={d.token}")[0] == 200
    status, page = get(d.base + "/")
    assert status == 200 and b"<script src=\"/app.js\">" in page and d.token.encode() not in page


def test_no_request_reaches_a_file_outside_the_page(finished_dashboard: Served, finished_run: Path) -> None:
    d = finished_dashboard
    secret = (finished_run / "keys" / "admin.json").read_bytes()
    for path in ("/../keys/admin.json", "/%2e%2e/keys/admin.json", "/api/trajectory/..%2Fkeys%2Fadmin.json",
                 "/api/trajectory/%2Fetc%2Fpasswd", "/api/trajectory/-1", "/api/trajectory/99999999999999",
                 "/app.js/../../keys/admin.json", "/style.css%00", "/keys/admin.json", "/api/trajectory/1e3"):
        status, body = get(d.base + path, d.token)
        assert status in (400, 404), (path, status)
        assert secret not in body and b"root:" not in body


def test_reads_are_bounded_and_bad_numbers_refused(finished_dashboard: Served) -> None:
    d = finished_dashboard
    status, body = get(f"{d.base}/api/trajectories?limit=1000000000", d.token)
    assert status == 200 and len(json.loads(body)["rows"]) <= 500
    for query in ("min_reward=nan", "offset=-5", "limit=abc", "max_reward=1e999999x"):
        status, body = get(f"{d.base}/api/trajectories?{query}", d.token)
        assert status == 400 and (b"not a number" in body or b"out of range" in body), (query, status, body)


def test_prometheus_text_equals_the_run(finished_dashboard: Served, finished_run: Path) -> None:
    status, body = get(finished_dashboard.base + "/metrics", finished_dashboard.token)
    assert status == 200
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(body.decode()) for s in family.samples}
    trajs = list(iter_trajectories(finished_run))
    assert samples[("polar_sessions_total", ())] == 5
    assert samples[("polar_sessions_ended_total", (("status", "completed"),))] == 4
    assert samples[("polar_sessions_ended_total", (("status", "error"),))] == 1
    assert samples[("polar_tokens_captured_total", ())] == sum(t.n_tokens for t in trajs)
    assert samples[("polar_trainable_tokens_total", ())] == sum(sum(tr.loss_mask) for t in trajs for tr in t.traces)
    assert samples[("polar_task_reward_mean", (("task", "calc-merge"),))] == 1.0
    assert samples[("polar_sessions_in_stage", (("stage", "RUN"),))] == 0


def test_metrics_log_is_appended_while_serving(finished_dashboard: Served, finished_run: Path) -> None:
    log = finished_run / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text().endswith("\n")):  # a whole line written
        assert time.monotonic() < deadline, "no metrics line within 60 s"
        time.sleep(0.1)
    last = json.loads(log.read_text().splitlines()[-1])
    assert last["done"] == 5 and last["state"] == "finished" and last["by_status"] == {"completed": 4, "error": 1}


def test_not_a_run_directory_is_a_clear_error(tmp_path: Path) -> None:
    from conftest import polar

    out = polar("dashboard", tmp_path, "--port", "0")
    assert out.returncode == 2 and "not a run directory" in out.stderr and "Traceback" not in out.stderr
