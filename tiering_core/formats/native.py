"""The compiled record decoder (``tiering_native``, built from ``native/`` by maturin), when it is there.

The pure-Python decoder in this package is the reference and the fallback: it accepts and rejects the
same inputs (tests/unit/test_native_decoder.py runs both on the same bytes). ``TIERING_NATIVE_DECODER=0``
turns the compiled one off (CI runs the decoder tests once so); without it installed, one log line says
the Python one is used and how to build the other.
"""

from __future__ import annotations

from types import ModuleType

from pydantic_settings import BaseSettings, SettingsConfigDict

from tiering_core.logs import get_logger

log = get_logger(__name__)


class DecoderSettings(BaseSettings):
    """``TIERING_NATIVE_DECODER``: use the compiled decoder when it is installed (default true)."""

    model_config = SettingsConfigDict(env_prefix="TIERING_")

    native_decoder: bool = True


def _load() -> ModuleType | None:
    if not DecoderSettings().native_decoder:
        log.info("record decoder: pure Python (TIERING_NATIVE_DECODER is off)")
        return None
    try:
        import tiering_native
    except ImportError as exc:
        log.warning(
            "record decoder: pure Python, the compiled one is not installed (bash deploy/setup.sh, or "
            "pip install ./native, builds it)",
            error=str(exc),
        )
        return None
    return tiering_native


NATIVE: ModuleType | None = _load()
DECODER = "python" if NATIVE is None else "native"
