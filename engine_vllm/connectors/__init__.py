"""vLLM's KV connectors in the World: NixlConnector's scheduler side and its worker's request
bookkeeping on 0.33 (nixl.py: pull; push.py: push, with its writer loop), on 0.10-0.20
(nixl_legacy.py: pull), the NIXL stand-ins (nixl_fakes.py), MooncakeConnector's scheduler
side and worker on 0.33 (mooncake.py, with mooncake_state.py, mooncake_loop.py and the
stand-ins for its native and I/O parts, mooncake_fakes.py) and the P/D glue between the
engines (pd.py)."""

from __future__ import annotations

from typing import Any

__all__ = ["new_transport"]


def new_transport(fabric: Any, core: Any, engine_id: str, lease: int,
                  transfer_time: float) -> Any:
    """The engine's NIXL worker for the scenario's connector and the installed release."""
    from racesim.engine_vllm.connectors.nixl import NixlTransport
    from racesim.engine_vllm.connectors.nixl_legacy import (
        LegacyNixlTransport,
        legacy_generation,
    )
    from racesim.engine_vllm.connectors.push import NixlPushTransport

    if fabric.connector == "mooncake":
        from racesim.engine_vllm.connectors.mooncake import MooncakeTransport

        return MooncakeTransport(core, engine_id, lease, transfer_time, fabric)
    if fabric.connector == "nixl-push":
        return NixlPushTransport(core, engine_id, lease, transfer_time, fabric)
    if legacy_generation() is not None:  # before 0.33
        return LegacyNixlTransport(core, engine_id, lease, transfer_time, fabric)
    return NixlTransport(core, engine_id, lease, transfer_time, fabric)
