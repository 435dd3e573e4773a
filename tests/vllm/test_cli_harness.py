"""A real CLI harness on a real engine: `polar-hpc run examples/calculator/mini_swe_agent.yaml -c
examples/calculator/vllm.yaml` (local mode, bwrap sandbox, its model path and Python pointed at the
tests' tiny model and vLLM venv) runs mini-swe-agent's `mini` CLI, unchanged, in tito and in
passthrough capture. Both sessions of each run complete with reward 1.0 (mini runs
`echo $((17 * 23 + 4))`, answers 395 and submits), each in ONE trace: its two calls merge (the
template renders the first reply back as sampled). For every call, the prompt ids in the trace are
what the session's vLLM renders from the conversation mini sent (recorded in the trace), and every
sampled token and logprob is what that vLLM samples there (`helpers.check_sampled_runs`). The
conversation mini sends is the one the tiny model is taught (`conversation.mini_lessons`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from conftest import polar
from e2e.helpers import trajectories
from polar_hpc.engines.tiny import conversation
from vllm.conftest import vllm_python
from vllm.helpers import check_sampled_runs, free_port, rendered
from vllm.model import model_dir

pytestmark = pytest.mark.timeout(2400)  # two runs, each starting its own vLLM, on a busy host
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "calculator"
MODES = ["tito", "passthrough"]


@pytest.fixture(scope="session")
def mini_runs(tmp_path_factory) -> dict[str, Path]:
    """One run per capture mode. Session-scoped, so that run alone (its runs set up before the
    session's vLLM) the file keeps one vLLM up at a time."""
    python = vllm_python()
    runs = {}
    for mode in MODES:
        tmp = tmp_path_factory.mktemp(f"mini-{mode}")
        config = yaml.safe_load((EXAMPLE / "vllm.yaml").read_text())
        config["engine"] |= {"model_path": str(model_dir()), "python": str(python), "port": free_port()}
        config["proxy"] = {"mode": mode}
        (tmp / "vllm.yaml").write_text(yaml.safe_dump(config))
        result = polar("run", EXAMPLE / "mini_swe_agent.yaml", "-c", tmp / "vllm.yaml", "--run-dir", tmp / "run",
                       timeout=1100, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"})
        assert result.returncode == 0, result.stdout + result.stderr
        assert "2 written: 2 completed" in result.stdout and "1.000" in result.stdout, result.stdout
        runs[mode] = tmp / "run"
    return runs


def test_mini_sends_what_the_tiny_model_is_taught():
    """If a mini-swe-agent upgrade changes its tool, the tiny model must be retaught (this fails)."""
    from minisweagent.models.utils.actions_toolcall import BASH_TOOL

    assert conversation.MINI_TOOLS == [BASH_TOOL]


@pytest.mark.parametrize("mode", MODES)
def test_mini_swe_agent_solves_it_in_one_token_exact_trace(mini_runs, vllm, mode):
    trajs = trajectories(mini_runs[mode])
    assert len(trajs) == 2
    taught = [messages for messages, tools, _ in conversation.mini_lessons()]
    for t in trajs:
        assert t.status == "completed" and t.reward == 1.0, (t.status, t.reward, t.metadata)
        assert len(t.traces) == 1 and t.metadata["chains"] == 1 and not t.metadata["chain_breaks"], t.metadata
        trace = t.traces[0]
        runs = check_sampled_runs(vllm, trace)
        assert len(runs) == 2  # `echo $((17 * 23 + 4))`, then the answer and the submit command
        assert trace.tools == conversation.MINI_TOOLS
        asks = [trace.messages[:i] for i, m in enumerate(trace.messages) if m["role"] == "assistant"]
        assert len(asks) == 2 and [m["role"] for m in asks[1]] == ["system", "user", "assistant", "tool"]
        assert asks[0] == taught[0] and asks[1][-1]["content"] == taught[1][-1]["content"]
        sequence = (trace.prompt_ids + trace.response_ids).tolist()
        for ask, (start, _) in zip(asks, runs):
            assert sequence[: len(trace.prompt_ids) + start] == rendered(vllm, ask, trace.tools)
