"""``tsspec ray serve --replicas N`` (a local Ray cluster on this machine) and ``tsspec ray deploy
config.yaml`` (Ray Serve's own config format, sent to a running cluster)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from tsspec.cli import flags

ray_app = typer.Typer(help="tsspec replicas under Ray Serve.", no_args_is_help=True)


def spec_args(spec, spec_type, spec_draft, spec_pmin, spec_draft_model, spec_adaptive) -> dict:
    """The speculation flags by name, for the replicas (each builds its own options)."""
    values = dict(spec=spec, spec_type=spec_type, spec_draft=spec_draft, spec_pmin=spec_pmin,
                  spec_draft_model=spec_draft_model, spec_adaptive=spec_adaptive)
    return {k: v for k, v in values.items() if v is not None}


@ray_app.command("serve")
def ray_serve(
    model: Annotated[Optional[str], typer.Option("--model", "-m", help="GGUF file (default: the embedded SmolLM2-135M-Instruct).")] = None,
    replicas: Annotated[int, typer.Option("--replicas", help="Engine replicas.")] = 2,
    host: Annotated[str, typer.Option("--host", help="Address Ray's HTTP proxy listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port.")] = 8000,
    max_seqs: Annotated[int, typer.Option("--max-seqs", help="Sequences a replica decodes together at most.")] = 8,
    spec: flags.Spec = None,
    spec_type: flags.SpecType = None,
    spec_draft: flags.SpecDraft = None,
    spec_pmin: flags.SpecPmin = None,
    spec_draft_model: flags.SpecDraftModel = None,
    spec_adaptive: flags.Adaptive = None,
) -> None:
    """Start a local Ray cluster and serve the model from N replicas (OpenAI API at /v1)."""
    from tsspec.errors import OptionsError

    if replicas < 1:
        raise OptionsError(f"--replicas must be >= 1, got {replicas}")
    if not 0 <= port <= 65535:
        raise OptionsError(f"--port must be between 0 and 65535, got {port}")
    if max_seqs < 1:
        raise OptionsError(f"--max-seqs must be >= 1, got {max_seqs}")
    import ray
    from ray import serve

    from .deployment import build_app

    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    args = {"model": model, "replicas": replicas, "engine": {"max_seqs": max_seqs},
            "spec": spec_args(spec, spec_type, spec_draft, spec_pmin, spec_draft_model, spec_adaptive)}
    serve.run(build_app(args), name="tsspec", route_prefix="/", blocking=False)
    typer.echo(f"[ray serve] {replicas} replicas on http://{host}:{port}/v1 (Ctrl-C stops)", err=True)
    try:
        import time

        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
        ray.shutdown()


@ray_app.command("deploy")
def ray_deploy(
    config: Annotated[str, typer.Argument(help="A Ray Serve config file (applications: import_path, args, deployments).")],
    address: Annotated[str, typer.Option("--address", help="The Ray dashboard of the cluster.")] = "http://localhost:8265",
) -> None:
    """Send a Ray Serve config (Ray's own format) to a running cluster, as `serve deploy` does."""
    from .config_file import load_config

    schema = load_config(config)
    from ray.dashboard.modules.serve.sdk import ServeSubmissionClient

    ServeSubmissionClient(address).deploy_applications(schema.model_dump(exclude_unset=True))
    names = ", ".join(app.name for app in schema.applications)
    typer.echo(f"sent {config} to {address}: applications {names}")


def register(app: typer.Typer) -> None:
    app.add_typer(ray_app, name="ray")
