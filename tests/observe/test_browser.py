"""The dashboard in a real (headless) chromium, as a person would use it: the numbers on the page
equal the shards and the journal, and a trajectory's highlighted tokens are its loss mask."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from observe.conftest import HOSTILE, Served, journal
from polar_hpc.shards import iter_trajectories

pytestmark = pytest.mark.timeout(900)


def open_page(browser, served: Served):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(served.page)
    page.wait_for_selector("body[data-loaded='1']", timeout=60_000)
    return page


def number(page, selector: str) -> int:
    return int(page.inner_text(selector).replace(",", ""))


def test_finished_run_page(browser, finished_dashboard: Served, finished_run: Path, tmp_path: Path) -> None:
    trajs = list(iter_trajectories(finished_run))
    ended = {(e["task"], e["sample"]) for e in journal(finished_run) if e["event"] == "result"}
    page = open_page(browser, finished_dashboard)
    assert page.inner_text("#state") == "finished" and page.inner_text("#eta") == "done"
    assert (number(page, "#done"), number(page, "#total")) == (len(ended), 5)
    assert number(page, "#tokens") == sum(t.n_tokens for t in trajs)
    assert number(page, "#trainable") == sum(sum(tr.loss_mask) for t in trajs for tr in t.traces)
    assert page.inner_text("#by-status") == "completed 4, error 1"
    assert page.locator("#trajectories tr.row").count() == len(trajs)
    assert "harness exited with code N" in page.inner_text("#errors")
    assert page.locator("#chart-throughput path").count() >= 1
    page.screenshot(path=str(tmp_path / "finished.png"), full_page=True)

    page.fill("#filter input[name=task]", "calc-per-call")
    page.click("#filter button")
    page.wait_for_function("document.querySelectorAll('#trajectories tr.row').length === 1")
    page.click("#trajectories tr.row")
    page.wait_for_selector("#detail:not([hidden]) .tokens")
    want = next(t for t in trajs if t.task_id == "calc-per-call")
    assert len(want.traces) == 2
    for i, tr in enumerate(want.traces):
        spans = page.locator(f".tokens[data-trace='{i}'] span.tok")
        masks = spans.evaluate_all("els => els.map(e => e.dataset.mask)")
        trained = spans.evaluate_all("els => els.map(e => e.classList.contains('trainable') ? 1 : 0)")
        n = len(tr.prompt_ids)
        assert masks[n:] == [str(m) for m in tr.loss_mask.tolist()] and masks[:n] == [""] * n
        assert trained == [0] * n + tr.loss_mask.tolist(), "highlighted tokens are exactly the loss mask"
        ids = spans.evaluate_all("els => els.map(e => Number(e.dataset.id))")
        assert ids == tr.prompt_ids.tolist() + tr.response_ids.tolist()
        logprobs = spans.evaluate_all("els => els.map(e => e.dataset.logprob)")
        assert [float(x) for x in logprobs[n:]] == pytest.approx(tr.logprobs.tolist(), abs=1e-5)
    page.locator(".tokens[data-trace='0'] span.tok.trainable").first.hover()
    assert "logprob" in page.inner_text("#tip")
    assert page.locator("#detail .msg.assistant").count() >= 1
    page.screenshot(path=str(tmp_path / "trajectory.png"), full_page=True)

    page.fill("#filter input[name=task]", "crash")  # its stderr is HTML: shown as text, never run
    page.click("#filter button")
    page.wait_for_function("document.querySelector('#trajectories tr.row td').textContent === 'crash'")
    page.click("#trajectories tr.row")
    page.wait_for_function("document.querySelector('#detail-session').textContent === 'crash#0.0'")
    shown = json.loads(page.text_content("#detail-meta pre") or "")
    assert shown["stderr_tail"].strip() == HOSTILE and shown["exit_code"] == 5
    assert page.evaluate("window.__injected") is None, "the run's text never runs as HTML"

    assert page.inner_text("#cost-text").startswith("not known")  # a local run: no Slurm accounting
    (finished_run / "accounting.json").write_text(json.dumps({"gpu_hours": 1.5, "cpu_hours": 3.25,
                                                              "gpu_hours_per_accepted": 0.375}))
    try:
        page.reload()
        page.wait_for_selector("body[data-loaded='1']", timeout=60_000)
        assert page.inner_text("#cost-text") == ("1.5 GPU-hours, 3.25 CPU-hours; 0.375 GPU-hours per accepted "
                                                 "trajectory")
    finally:
        (finished_run / "accounting.json").unlink()
    page.close()


def test_live_run_page(browser, live_run: Path, tmp_path: Path) -> None:
    served = Served(live_run)
    try:
        page = open_page(browser, served)
        ended = {(e["task"], e["sample"]) for e in journal(live_run) if e["event"] == "result"}
        assert page.inner_text("#state") == "running"
        assert (number(page, "#done"), number(page, "#total")) == (len(ended), 4) == (2, 4)
        cells = page.locator("#stages td").all_inner_texts()
        heads = page.locator("#stages th").all_inner_texts()
        assert dict(zip(heads, map(int, cells)))["RUN"] == 2
        assert page.locator("#trajectories tr.row").count() == 2
        assert page.inner_text("#eta") not in ("done", "-")
        page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
        page.close()
    finally:
        served.close()


@pytest.fixture(autouse=True)
def _keep_screenshots(tmp_path: Path):
    yield
    assert list(tmp_path.glob("*.png")), "each page's screenshot is kept in the test's folder"
