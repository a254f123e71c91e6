"""Loading a config: TOML plus dotted overrides, validated up front; dumping one back to TOML; the CLI."""

from __future__ import annotations

import argparse
import json
import tomllib
from pathlib import Path

from pydantic import BaseModel, ValidationError

from .run_config import RunConfig


class ConfigError(ValueError):
    """A config file or override that does not validate; the message names the key."""


def _parse_value(raw: str) -> object:
    # TOML scalar syntax for values (numbers, booleans, quoted strings); anything else is a bare string.
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


# Tables that a plain value may stand for: `trainer.loss = "dapo"` is `trainer.loss.name = "dapo"`.
_SHORTHAND = {("trainer", "loss"): "name"}


def apply_override(data: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override {override!r} is not of the form section.key=value")
    key, raw = override.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for depth, part in enumerate(parts[:-1], 1):
        if (short := _SHORTHAND.get(tuple(parts[:depth]))) and not isinstance(node.get(part, {}), dict):
            node[part] = {short: node[part]}  # trainer.loss.clip_eps=... over a config's `loss = "dapo"`
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r}: {part!r} is not a section")
    value = _parse_value(raw.strip())
    short = _SHORTHAND.get(tuple(parts))
    if short and isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
        node[parts[-1]][short] = value  # trainer.loss=dapo over a [trainer.loss] table: its name, the rest kept
    else:
        node[parts[-1]] = value


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read TOML (if given), apply dotted overrides, validate. Raises ConfigError naming the bad key."""
    data: dict = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read config {path}: {e}") from e
    for override in overrides:
        apply_override(data, override)
    resume = data.get("run", {}).get("resume") if isinstance(data.get("run"), dict) else None
    # A service reads the placed config.toml its launcher wrote into the resumed run's folder: that one stands.
    if resume and not (path and Path(path).resolve() == (Path(str(resume)) / "config.toml").resolve()):
        data = _resumed(str(resume), overrides)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        errors = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"invalid config: {errors}") from None


def _resumed(resume: str, overrides: list[str] | tuple[str, ...]) -> dict:
    """The config of a resumed run: the run folder's asked.toml (the config its launcher was given, before ports
    and hosts were placed; config.toml for a service, which reads its launcher's placed one), the overrides on
    top, its run_id and output_dir kept (a continued run writes where it wrote before)."""
    folder = Path(resume)
    base = folder / "asked.toml"
    try:
        data = tomllib.loads((base if base.exists() else folder / "config.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"run.resume = {resume!r} is not a run folder with a readable config.toml: {e}") from None
    for override in overrides:
        apply_override(data, override)
    data["run"].update(resume=str(folder), run_id=folder.resolve().name, output_dir=str(folder.resolve().parent))
    return data


def dump_toml(cfg: RunConfig) -> str:
    """The whole config as TOML, so every child process reads exactly what was validated; a section's
    subsections (trainer.loss, ...) as tables of their own ([trainer.loss])."""
    lines: list[str] = []
    for name in type(cfg).model_fields:
        _dump_table(name, getattr(cfg, name), lines)
    return "\n".join(lines)


def _dump_table(name: str, section: BaseModel, lines: list[str]) -> None:
    values = section.model_dump()
    subsections = [key for key in values if isinstance(getattr(section, key), BaseModel)]
    lines.append(f"[{name}]")
    lines += [f"{key} = {_toml_value(value)}" for key, value in values.items() if key not in subsections]
    lines.append("")
    for key in subsections:
        _dump_table(f"{name}.{key}", getattr(section, key), lines)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON's string escapes are TOML's basic-string escapes
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return repr(value)


def config_from_cli(
    description: str, parser: argparse.ArgumentParser | None = None
) -> tuple[RunConfig, argparse.Namespace]:
    """`--config FILE` plus dotted overrides, the command line of every service entrypoint."""
    parser = parser or argparse.ArgumentParser()
    parser.description = description
    parser.add_argument("--config", default=None, help="run TOML")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-4")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    from services.common import auth, tls

    auth.load_for_run(Path(cfg.run.output_dir) / cfg.run.run_id)
    tls.load_for_run(Path(cfg.run.output_dir) / cfg.run.run_id)
    return cfg, args
