"""The calculator example with a real engine, as the README runs it: `polar-hpc run
examples/calculator/task.yaml -c examples/calculator/vllm.yaml` (its model path and Python pointed
at the tests' tiny model and vLLM venv) launches vLLM, and all 8 sessions solve the task (reward
1.0) with the tiny model, at the agent's temperature (1). Each session is one trace (prefix_merge),
token-exact: every sampled run is what the session's own vLLM samples after the tokens before it
(asked again with the same prompt ids; the model is peaked enough that temperature 1 gives the
same ids), and its logprobs are that vLLM's, up to float summation order (the run's vLLM batched
concurrent sessions); tito's first prompt is vLLM's own rendering of the agent's first call."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from conftest import polar
from e2e.helpers import trajectories
from polar_hpc.engines.tiny import conversation as calc
from vllm.conftest import vllm_python
from vllm.helpers import check_sampled_runs, rendered
from vllm.model import model_dir

pytestmark = pytest.mark.timeout(1800)  # two vLLM starts (the run's and the session's) on a busy host
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator"


@pytest.fixture(scope="module")
def calculator_run(tmp_path_factory) -> Path:
    python = vllm_python()
    tmp = tmp_path_factory.mktemp("calc-vllm")
    config = yaml.safe_load((EXAMPLE / "vllm.yaml").read_text())
    config["engine"] |= {"model_path": str(model_dir()), "python": str(python)}
    (tmp / "vllm.yaml").write_text(yaml.safe_dump(config))
    run_dir = tmp / "run"
    result = polar("run", EXAMPLE / "task.yaml", "-c", tmp / "vllm.yaml", "--run-dir", run_dir, timeout=1500,
                   env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "8 written: 8 completed" in result.stdout and "1.000" in result.stdout, result.stdout
    return run_dir


def test_every_session_solves_it_in_one_token_exact_trace(calculator_run, vllm):
    trajs = trajectories(calculator_run)
    assert len(trajs) == 8
    for t in trajs:
        assert t.reward == 1.0 and len(t.traces) == 1, (t.reward, t.metadata)
        trace = t.traces[0]
        assert t.metadata["chains"] == 1 and not t.metadata["chain_breaks"]
        assert len(check_sampled_runs(vllm, trace)) == 2  # the calculator call, then the answer
    asked = [{"role": "system", "content": calc.SYSTEM}, {"role": "user", "content": calc.QUESTION}]
    assert all(t.traces[0].prompt_ids.tolist() == rendered(vllm, asked, calc.TOOLS) for t in trajs)
