"""``tsspec ray deploy``'s config file: Ray Serve's own schema, checked in one line before sending."""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from tsspec.errors import OptionsError

from tsspec_ray.config_file import load_config

GOOD = """applications:
  - name: tsspec
    route_prefix: /
    import_path: tsspec_ray.deployment:build_app
    args: {replicas: 2, engine: {max_seqs: 4}}
"""


def test_a_ray_serve_config_loads(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(GOOD)
    schema = load_config(str(path))
    assert [a.name for a in schema.applications] == ["tsspec"]


@pytest.mark.parametrize("text, message", [
    ("applications: [", "not YAML"),
    ("applications: 3", "not a Ray Serve config"),
    (GOOD.replace("tsspec_ray.deployment:build_app", "other:app"), "tsspec's is tsspec_ray.deployment:build_app"),
    (GOOD.replace("replicas: 2", "replicas: 0"), "args.replicas must be a whole number >= 1"),
])
def test_bad_configs_fail_in_one_line(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(OptionsError, match=message) as info:
        load_config(str(path))
    assert "\n" not in str(info.value)


def test_a_missing_file(tmp_path):
    with pytest.raises(OptionsError, match="cannot read"):
        load_config(str(tmp_path / "none.yaml"))
