"""Loading pydantic-settings classes from a YAML or TOML file, ``TIERING_*`` env vars and overrides.

Precedence: explicit arguments, then environment variables (``TIERING_BOOTSTRAP_SERVERS``, nested with
``__``: ``TIERING_REMOTE_STORAGE__BUCKET``), then the file, then defaults. The sidecar's and the
reader's settings both load through here, so one file can serve both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsError,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from tiering_core.errors import ConfigError

S = TypeVar("S", bound=BaseSettings)


def load_settings_file(cls: type[S], config_file: Path | None, what: str, **overrides: Any) -> S:
    """An instance of ``cls`` from ``config_file`` (.yaml/.yml/.toml), the environment and ``overrides``.

    Raises ConfigError naming the file and the invalid fields.
    """
    if config_file is not None and not config_file.exists():
        raise ConfigError(f"configuration file {config_file} does not exist")

    class _FromFile(cls):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:  # fmt: skip
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if config_file is not None:
                if config_file.suffix == ".toml":
                    sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
                else:
                    sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
            return tuple(sources)

    try:
        return cls.model_validate(_FromFile(**overrides).model_dump())
    except yaml.YAMLError as exc:  # a file that is not YAML: where it breaks, in the parser's words
        raise ConfigError(f"invalid {what}: {config_file} is not valid YAML: {_yaml_problem(exc)}") from None
    except (ValueError, SettingsError) as exc:  # pydantic's ValidationError is a ValueError
        where = f" in {config_file}" if config_file else ""
        raise ConfigError(f"invalid {what}{where}:\n{_describe(exc)}") from None  # the cause holds the values


def _describe(exc: Exception) -> str:
    """Each invalid field and why, never its value: pydantic prints the input (a whole ``remote_storage``
    section with its ``secret_access_key``) and the message must not carry secrets."""
    if not isinstance(exc, ValidationError):
        return f"  {exc}"
    lines = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        loc = [str(part) for i, part in enumerate(error["loc"]) if i == 0 or error["loc"][i - 1] not in _TAGGED]
        where = ".".join(loc) or "(the configuration)"
        lines.append(f"  {where}: {'unknown setting' if error['type'] == 'extra_forbidden' else error['msg']}")
    return "\n".join(lines)


# Sections whose models are a union told apart by ``kind``: pydantic puts the kind in the error's location
# (remote_storage.s3.buckt), which is not where the user wrote the key (remote_storage.buckt).
_TAGGED = {"remote_storage"}


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's complaint and its line and column, on one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return f"{exc.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(exc).split())
