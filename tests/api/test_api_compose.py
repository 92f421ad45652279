"""docker-compose.yml: valid against the compose specification's JSON schema, and its env vars, ports and
addresses agree with the settings the code reads (no Docker engine needed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from api_helpers import REPO

from api.config import ApiSettings

COMPOSE = REPO / "docker-compose.yml"
SCHEMA = Path(__file__).parent / "data" / "compose-spec.schema.json"
OURS = ("api", "ray-head", "ray-worker")  # services running the topotune image


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _env_names() -> set[str]:
    names = set()
    for name, field in ApiSettings.model_fields.items():
        alias = field.validation_alias
        names.add(alias if isinstance(alias, str) else f"TOPOTUNE_{name.upper()}")
    return names


def _interpolate(value: str) -> str:
    """What compose substitutes: ${VAR:-default} -> default, ${VAR:?err} -> a placeholder."""
    value = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)
    return re.sub(r"\$\{[A-Z_]+:\?[^}]*\}", "compose-placeholder-token-0123456789", value)


def test_compose_file_matches_the_specification(compose):
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft201909Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_schema_catches_mistakes(compose):
    schema = json.loads(SCHEMA.read_text())
    broken = json.loads(json.dumps(compose))
    broken["services"]["api"]["healthcheck"]["retires"] = 3
    assert list(jsonschema.Draft201909Validator(schema).iter_errors(broken))


def test_env_vars_are_settings(compose):
    readable = _env_names()
    for service in OURS:
        env = compose["services"][service].get("environment", {})
        unknown = set(env) - readable
        assert not unknown, f"{service}: env vars no settings class reads: {unknown}"
    api_env = compose["services"]["api"]["environment"]
    assert "TOPOTUNE_API_TOKEN" in api_env  # required: auth is on and the token has no default
    assert ":?" in api_env["TOPOTUNE_API_TOKEN"], "compose must refuse to start without a token"
    for name, field in ApiSettings.model_fields.items():
        if field.is_required():
            assert f"TOPOTUNE_{name.upper()}" in api_env, name


def test_settings_load_from_the_compose_env(compose, monkeypatch):
    env = {k: _interpolate(str(v)) for k, v in compose["services"]["api"]["environment"].items()}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = ApiSettings()
    assert settings.database_url.startswith("postgresql+psycopg://topotune:")
    assert settings.executor == "ray" and settings.token()
    # ports and addresses agree across services
    published = compose["services"]["api"]["ports"][0]
    assert published == f"127.0.0.1:{settings.port}:{settings.port}"
    head_cmd = compose["services"]["ray-head"]["command"]
    assert f"--port={settings.ray_port}" in head_cmd and settings.ray_port != 6379
    assert settings.ray_address == f"ray-head:{settings.ray_port}"
    assert f"--address={settings.ray_address}" in compose["services"]["ray-worker"]["command"]
    assert "@postgres:5432/" in settings.database_url and "postgres" in compose["services"]
    assert str(settings.model_store) in [v.split(":")[1] for v in compose["services"]["api"]["volumes"]]
    assert str(settings.default_space).startswith("/app/search_spaces/")
    assert (REPO / "search_spaces" / settings.default_space.name).exists()


def test_services_have_healthchecks_and_named_volumes(compose):
    for name, service in compose["services"].items():
        assert "healthcheck" in service, name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source in compose["volumes"], f"{name}: {source} is not a named volume"
    depends = compose["services"]["api"]["depends_on"]
    assert depends["postgres"]["condition"] == depends["ray-head"]["condition"] == "service_healthy"


def test_images_are_pinned_and_mounts_absolute(compose):
    """#46: no :latest (the topotune image carries the project's version) and no relative host path."""
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, service in compose["services"].items():
        image = _interpolate(service["image"])
        assert ":" in image and not image.endswith(":latest"), f"{name}: {image}"
        if name in OURS:
            assert image == f"topotune:{version}"
        for volume in service.get("volumes", []):
            source = _interpolate(volume).split(":")[0]
            assert source.startswith("/") or "/" not in source, f"{name}: relative mount {volume}"
