"""A Ray Serve config file (Ray's own schema, ``ServeDeploySchema``), checked before it is sent."""

from __future__ import annotations

from tsspec.errors import OptionsError

IMPORT_PATH = "tsspec_ray.deployment:build_app"


def load_config(path: str):
    """The validated schema; a missing file, bad YAML, a schema error or an application that is
    not tsspec's is one OptionsError line."""
    import yaml
    from ray.serve.schema import ServeDeploySchema

    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except OSError as exc:
        raise OptionsError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise OptionsError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    try:
        schema = ServeDeploySchema.model_validate(raw)
    except Exception as exc:
        first = str(exc).replace("\n", " ")
        raise OptionsError(f"{path}: not a Ray Serve config ({first[:300]})") from None
    for app in schema.applications:
        if app.import_path != IMPORT_PATH:
            raise OptionsError(f"{path}: application {app.name!r} imports {app.import_path!r}; tsspec's is {IMPORT_PATH}")
        replicas = (app.args or {}).get("replicas", 1)
        if not isinstance(replicas, int) or replicas < 1:
            raise OptionsError(f"{path}: application {app.name!r}: args.replicas must be a whole number >= 1, got {replicas!r}")
    return schema
