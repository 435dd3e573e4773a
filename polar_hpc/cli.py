"""The `polar-hpc` command line: each command is a thin call into a module below.

Every command turns a `ConfigError` (bad input) into a one-line message on stderr and exit code 2,
with no traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn, Optional

import typer

from polar_hpc.errors import ConfigError, PolarError

app = typer.Typer(
    help="Token-exact RL rollouts of unmodified LLM agent harnesses, on Slurm or locally.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


shards_app = typer.Typer(help="Read the trajectory shards of a run.", no_args_is_help=True)
app.add_typer(shards_app, name="shards")
image_app = typer.Typer(help="Images: build ours (containers/), pull a suite's task environments.", no_args_is_help=True)
app.add_typer(image_app, name="image")
tasks_app = typer.Typer(help="Task files and suites (Harbor task folders, SWE-bench datasets).", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")
_TASKS_HELP = ("Tasks: YAML (one or a list) or JSONL of ours, a Harbor task folder (or a folder of them), "
               "a SWE-bench dataset (.jsonl, .json, .parquet), or a suite file (`suite: PATH`, docs/tasks.md).")


def _guard(fn):
    """Run fn(); a PolarError becomes a one-line error and its exit code (2: bad input or a refused
    submission or request; 1: what went wrong at run time: a child that died, a tool that failed)."""
    try:
        return fn()
    except PolarError as e:
        _exit(e)


@app.command()
def run(
    tasks: Optional[Path] = typer.Argument(None, help=_TASKS_HELP + " Optional with --service."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="topology.yaml (default: built-in)."),
    run_dir: Optional[Path] = typer.Option(None, help="Where the run's files go (default: a new folder under ./runs/)."),
    service: bool = typer.Option(
        False, "--service", help="Keep running for trainers (polar_hpc.client) until one drains the run."
    ),
) -> None:
    """Run a job on this machine: scripted engine, orchestrator, one gateway with its proxy."""
    from rich.console import Console

    from polar_hpc.launch.local import LocalRun, run_local

    spec = LocalRun(tasks, config, run_dir, service)
    raise typer.Exit(_guard(lambda: run_local(spec, Console())))


@app.command()
def orchestrator(
    run_dir: Path = typer.Option(..., help="The run directory (holds topology.yaml and tasks.jsonl)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(0, help="TCP port; 0 picks a free one."),
    advertise: Optional[str] = typer.Option(None, help="Host name peers connect to (default: --host)."),
    engine_url: list[str] = typer.Option(
        [], help="An engine that does not register itself (weight updates reach it too); repeatable."
    ),
) -> None:
    """Run the orchestrator of a run (started for you by `run` and `submit`)."""
    from polar_hpc.orchestrator.server import serve

    raise typer.Exit(_guard(lambda: serve(run_dir, host, port, advertise, tuple(engine_url))))


@app.command()
def gateway(
    run_dir: Path = typer.Option(..., help="The run directory."),
    orchestrator: str = typer.Option(..., help="Orchestrator endpoint, e.g. tcp://host:port."),
    engine_url: Optional[str] = typer.Option(
        None, help="Engine base URL, e.g. http://host:port (default: the engines registered with the orchestrator)."
    ),
    gateway_id: str = typer.Option(..., help="This gateway's name (its shards are named after it)."),
    tmp_dir: Optional[Path] = typer.Option(None, help="Node-local folder for session workspaces."),
) -> None:
    """Run a gateway: sessions in sandboxes, its proxy, shard writing (one per node)."""
    from polar_hpc.gateway.server import GatewayOptions, serve

    raise typer.Exit(_guard(lambda: serve(GatewayOptions(run_dir, orchestrator, engine_url, gateway_id, tmp_dir))))


@app.command()
def proxy(
    launch: str = typer.Argument(
        ..., help="Its settings, as JSON (polar_hpc.wire.ProxyLaunch: the gateway writes it from the topology)."),
    ready_file: Optional[Path] = typer.Option(None, help="Write {'url': ...} here once listening."),
) -> None:
    """Serve LLM APIs to harnesses from the engines, recording every call (started by the gateway)."""
    from polar_hpc import wire
    from polar_hpc.proxy.server import serve

    raise typer.Exit(_guard(lambda: serve(wire.proxy_launch(launch), ready_file)))


@app.command()
def submit(
    config: Path = typer.Option(..., "--config", "-c", help="topology.yaml (with a `slurm:` section)."),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help=_TASKS_HELP + " Optional when service.enabled."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory on the shared filesystem (default: ./runs/...)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the sbatch script; submit nothing."),
) -> None:
    """Submit ONE Slurm heterogeneous job: GPU nodes run engines, CPU nodes run gateways."""
    from polar_hpc.launch import slurm

    def go() -> None:
        if dry_run:
            from polar_hpc.config import load_topology
            from polar_hpc.launch.rundir import check_new, load_run_tasks

            topology = load_topology(config)
            load_run_tasks(tasks, topology)
            target = check_new((run_dir or Path(topology.run_dir or "runs/DRY-RUN")).resolve())
            typer.echo(slurm.dry_run(topology, target), nl=False)
            return
        job_id, where = slurm.submit(tasks, config, run_dir)
        typer.echo(f"submitted job {job_id}\nrun directory {where}\nfollow it: polar-hpc status {job_id}")

    _guard(go)


@app.command()
def resume(target: str = typer.Argument(..., help="Run directory or Slurm job id of a run whose job has ended.")) -> None:
    """Submit a new job for a run that stopped before its sessions ended; it continues from the journal."""
    from polar_hpc.launch import slurm

    def go() -> None:
        job_id, where = slurm.resume(target)
        typer.echo(f"submitted job {job_id}\nrun directory {where}\nfollow it: polar-hpc status {job_id}")

    _guard(go)


@app.command("sbatch")
def sbatch_script(
    config: Path = typer.Option(..., "--config", "-c", help="topology.yaml (with a `slurm:` section)."),
    tasks: Optional[Path] = typer.Option(None, "--tasks", help=_TASKS_HELP + " Optional when service.enabled."),
    run_dir: Optional[Path] = typer.Option(None, help="Run directory on the shared filesystem (default: ./runs/...)."),
) -> None:
    """Prepare a run directory and print the same job as a plain sbatch script (submit it yourself)."""
    from polar_hpc.launch import slurm

    def go() -> None:
        where, topology = slurm.prepare_run(tasks, config, run_dir)
        typer.echo(slurm.render_sbatch(topology, where), nl=False)

    _guard(go)


@app.command()
def status(
    target: str = typer.Argument(..., help="Run directory or Slurm job id."),
    watch: bool = typer.Option(False, "--watch", help="Refresh until the run ends (or Ctrl-C)."),
) -> None:
    """Slurm state, engines and gateways, sessions by state, throughput and ETA of a run."""
    from rich.console import Console

    from polar_hpc.launch.status import show, watch_run

    _guard(lambda: watch_run(target, Console()) if watch else show(target, Console()))


@app.command()
def dashboard(
    run_dir: Path = typer.Argument(..., help="The run directory (the job may still be running)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8265, help="TCP port; 0 picks a free one."),
) -> None:
    """Serve a web page of a run (progress, plots, errors, trajectories) and its Prometheus /metrics."""
    from polar_hpc.observe.server import DashboardOptions, serve

    raise typer.Exit(_guard(lambda: serve(DashboardOptions(run_dir, host, port))))


@app.command()
def cancel(target: str = typer.Argument(..., help="Run directory or Slurm job id.")) -> None:
    """Stop a run cleanly (what the gateways hold is written); scancel if it does not stop."""
    from rich.console import Console

    from polar_hpc.launch.status import cancel as cancel_run

    _guard(lambda: cancel_run(target, Console()))


@app.command()
def grow(
    target: str = typer.Argument(..., help="Run directory or Slurm job id of a run whose job is queued or running."),
    nodes: int = typer.Option(1, "--nodes", "-N", help="Gateway nodes to add (one gateway each; 0: engines only)."),
    engines: int = typer.Option(0, "--engines", help="Engine nodes to add, shaped like slurm.gpu (one engine step each)."),
    partition: Optional[str] = typer.Option(
        None, help="Partition of every node (default: slurm.cpu's, slurm.gpu's); a preemptible one is fine."),
    time: Optional[str] = typer.Option(None, "--time", help="The grow job's time limit (default: slurm.time)."),
    cpus: Optional[int] = typer.Option(None, help="CPUs per node (default: slurm.cpu.cpus)."),
    sbatch: Optional[list[str]] = typer.Option(None, "--sbatch", help="More sbatch flags, e.g. --sbatch=--qos=low (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the grow job's sbatch script; submit nothing."),
) -> None:
    """Add gateway (and engine) nodes to a running run as a separate Slurm job; they join it and take work."""
    from polar_hpc.launch.grow import GrowSpec
    from polar_hpc.launch.grow import grow as grow_run

    def go() -> None:
        spec = GrowSpec(nodes, partition, time, cpus, tuple(sbatch or ()), dry_run, engines)
        out, where = grow_run(target, spec)
        if dry_run:
            typer.echo(out, nl=False)
            return
        typer.echo(f"submitted grow job {out} for {where}\nfollow it: polar-hpc status {where}\n"
                   f"give the nodes back: polar-hpc shrink {where} {out}")

    _guard(go)


@app.command()
def shrink(
    target: str = typer.Argument(..., help="Run directory or Slurm job id of the run."),
    job: Optional[str] = typer.Argument(None, help="One grow job of the run (default: all of them)."),
) -> None:
    """Give a run's grow nodes back (scancel its grow jobs); the run's own job is untouched."""
    from polar_hpc.launch.grow import shrink as shrink_run

    def go() -> None:
        gone = shrink_run(target, job)
        typer.echo(f"scancel sent to grow job {', '.join(gone)}: its gateways and engines leave within the stop budget"
                   if gone else "no grow job of this run is queued or running")

    _guard(go)


@app.command(hidden=True)
def member(
    run_dir: Path = typer.Option(..., help="The run directory."),
    roles: str = typer.Option("gateway", help="The job's components in het-group order: engine,gateway."),
) -> None:
    """A grow job's member driver (run by its sbatch script): engines and gateways that join the run."""
    from polar_hpc.launch.member import ROLES, serve

    parts = tuple(roles.split(","))
    if not parts or not set(parts) <= set(ROLES) or len(set(parts)) != len(parts):
        _exit(ConfigError(f"member --roles {roles!r}: a comma list of {', '.join(ROLES)}, each once"))
    raise typer.Exit(_guard(lambda: serve(run_dir, parts)))


@app.command(hidden=True)
def driver(run_dir: Path = typer.Option(..., help="The run directory.")) -> None:
    """The job's driver (run by the sbatch script in component 0's batch step)."""
    from polar_hpc.launch.driver import drive

    raise typer.Exit(_guard(lambda: drive(run_dir)))


_RUN_DIR = typer.Argument(..., help="The run directory.")
_JSON = typer.Option(False, "--json", help="One JSON object per line instead of a table.")
_STATUS = typer.Option(None, "--status", help="Keep only this status (repeatable).")
_REWARD = typer.Option(None, "--reward", help="Keep rewards in LO:HI (either end may be empty, e.g. 0.5:).")
_VERSIONS = typer.Option(None, "--weight-versions", help="Keep trajectories whose calls all used versions in LO:HI.")


@shards_app.command("show")
def shards_show(
    run_dir: Path = _RUN_DIR,
    json_lines: bool = _JSON,
    full: bool = typer.Option(False, "--full", help="With --json: every field (ids, masks, logprobs, metadata)."),
) -> None:
    """Print the trajectories of a run as a table (or JSON lines)."""
    from polar_hpc.shards import table

    _guard(lambda: table.show(run_dir, json_lines, full))


@shards_app.command("ls")
def shards_ls(run_dir: Path = _RUN_DIR, json_lines: bool = _JSON) -> None:
    """List the sealed shards of a run: records, size, when sealed, whether indexed."""
    from polar_hpc.shards import table

    _guard(lambda: table.ls(run_dir, json_lines))


@shards_app.command("verify")
def shards_verify(run_dir: Path = _RUN_DIR) -> None:
    """Check every record (damage: file and byte offset) and every journaled result; exit 1 on a problem."""
    from polar_hpc.shards import table

    raise typer.Exit(_guard(lambda: table.verify_run(run_dir)))


@shards_app.command("export")
def shards_export(
    run_dir: Path = _RUN_DIR,
    out: Path = typer.Option(..., "--out", "-o", help="File to write."),
    fmt: str = typer.Option("parquet", "--format", help="parquet (needs pyarrow) or jsonl."),
    status: Optional[list[str]] = _STATUS,
    reward: Optional[str] = _REWARD,
    weight_versions: Optional[str] = _VERSIONS,
) -> None:
    """Export the run's trajectories, one row per trace (token ids, masks, logprobs, messages)."""
    from polar_hpc.shards import table

    _guard(lambda: table.export(run_dir, out, fmt, table.cli_filter(status, reward, weight_versions)))


@shards_app.command("follow")
def shards_follow(
    run_dir: Path = typer.Argument(..., help="The run directory (the job may still be running)."),
    cursor: Optional[Path] = typer.Option(None, help="Cursor file: a rerun with it continues where this one stopped."),
    json_lines: bool = _JSON,
    idle_timeout: Optional[float] = typer.Option(None, help="Stop after this many seconds with nothing new."),
    status: Optional[list[str]] = _STATUS,
    reward: Optional[str] = _REWARD,
    weight_versions: Optional[str] = _VERSIONS,
) -> None:
    """Print each trajectory the journal accepted as its shard is sealed, until the run is complete."""
    from polar_hpc.shards import table

    keep = _guard(lambda: table.cli_filter(status, reward, weight_versions))
    raise typer.Exit(_guard(lambda: table.follow(run_dir, cursor, keep, json_lines, idle_timeout)))


@image_app.command("build")
def image_build(
    name: str = typer.Argument(..., help="gateway, harness-python, harness-node, or a path to a .def file."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="The SIF to write (default: NAME.sif here)."),
    fakeroot: bool = typer.Option(True, help="Build with --fakeroot (rootless builds on clusters)."),
) -> None:
    """Build an Apptainer image (`apptainer build`); put the SIF on the shared filesystem."""
    from polar_hpc.sandbox import images

    out = output or Path(f"{Path(name).stem}.sif")
    raise typer.Exit(_guard(lambda: images.build(name, out.resolve(), fakeroot)))


@image_app.command("pull")
def image_pull(
    suite: Path = typer.Argument(..., help=_TASKS_HELP),
    cache: Optional[Path] = typer.Option(None, help="Image cache (default: $POLAR_IMAGE_CACHE, else ~/.cache/polar-hpc/images)."),
) -> None:
    """Fetch each image a suite's tasks name, and build each Dockerfile-only task (buildah), once into the
    cache, keyed by digest (login node)."""
    from rich.console import Console

    from polar_hpc.suites import images

    _guard(lambda: images.pull_suite(suite, (cache or images.cache_dir()).absolute(), Console(width=160)))


@tasks_app.command("check")
def tasks_check(suite: Path = typer.Argument(..., help=_TASKS_HELP)) -> None:
    """Validate tasks or a suite as `run` would (errors: file, line or row, field; exit 2) and list them."""
    from rich.console import Console

    from polar_hpc.suites import check

    _guard(lambda: check.show(suite, Console(width=160)))


@app.command()
def engine(
    kind: str = typer.Option("scripted", help="'scripted' (CPU test/demo engine), 'sglang' or 'vllm' (with --run-dir)."),
    run_dir: Optional[Path] = typer.Option(
        None, help="Engine step of a Slurm run: start the servers, register them with the orchestrator."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(0, help="TCP port; 0 picks a free one."),
    ready_file: Optional[Path] = typer.Option(None, help="Write {'url': ...} here once listening."),
    script: Optional[Path] = typer.Option(None, help="Policy rules (YAML); default: built-in rules."),
    weight_version: str = typer.Option("v0", help="Weight version the engine reports."),
    sample_log: Optional[Path] = typer.Option(None, help="Append one JSON line per generation."),
    token_delay_ms: float = typer.Option(0.0, help="Simulated time per generated token."),
    update_load_ms: float = typer.Option(0.0, min=0.0, help="Simulated load time of a weight update."),
    context_length: Optional[int] = typer.Option(None, help="Longest prompt + output, in tokens (default 65536)."),
    model_name: str = typer.Option("polar-scripted", help="Model name the engine serves."),
    tag: Optional[str] = typer.Option(None, help="Engine step: names its engines TAG-i and their logs (default: the node)."),
    metrics: bool = typer.Option(True, help="Serve /metrics (--no-metrics: 404, as SGLang without --enable-metrics)."),
) -> None:
    """Run the scripted engine, or (with --run-dir) a run's engine step: its servers, registered."""
    from polar_hpc.config import SCRIPTED_CONTEXT
    from polar_hpc.engines import kinds
    from polar_hpc.engines.scripted import server as scripted

    if kind not in kinds.KINDS:
        _exit(ConfigError(f"engine --kind: unknown kind {kind!r} (known: {', '.join(kinds.KINDS)})"))
    if run_dir is not None:
        from polar_hpc.engines.step import main

        _guard(lambda: main(kind, run_dir, tag))
        return
    if kind != "scripted":
        _exit(ConfigError(f"engine --kind {kind}: needs --run-dir (it runs as the engine step of a run)"))
    options = scripted.ScriptedOptions(
        host=host,
        port=port,
        ready_file=ready_file,
        script=script,
        weight_version=weight_version,
        sample_log=sample_log,
        token_delay_ms=token_delay_ms,
        update_load_ms=update_load_ms,
        context_length=SCRIPTED_CONTEXT if context_length is None else context_length,
        model_name=model_name,
        metrics=metrics,
    )
    _guard(lambda: scripted.serve(options))


def _exit(error: PolarError) -> NoReturn:
    """End the command: the error's one line on stderr, and its exit code."""
    typer.echo(f"error: {error}", err=True)
    raise typer.Exit(error.exit_code) from None
