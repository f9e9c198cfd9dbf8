"""OpenClaw's start-up settings (harness_env/harnesses/openclaw.py): the two documented settings that cut its
start-up CPU are in its environment and config, and the run's invocation record names both."""

import asyncio
import json

from harness_env.harnesses.base import SessionContext, get_harness

CTX = SessionContext(base_url="http://127.0.0.1:4000/s/sess1", api_key="sk-sess1", model="policy")


def test_openclaw_startup_settings_are_set_and_recorded(tmp_path):
    h = get_harness("openclaw")
    asyncio.run(h.prepare(tmp_path, CTX))
    # Node's documented switch: no compile cache written to the sandbox's throwaway /tmp at every exit.
    assert h.env(CTX)["NODE_DISABLE_COMPILE_CACHE"] == "1"
    # session.maintenance.mode "warn": no SQLite reclamation Worker passes on a state dir that lives one run.
    assert json.loads((tmp_path / "openclaw.json").read_text())["session"] == {"maintenance": {"mode": "warn"}}
    record = h.invocation(tmp_path, "p", CTX)
    assert record["env"]["NODE_DISABLE_COMPILE_CACHE"] == "1"
    assert json.loads(record["config_files"]["openclaw.json"])["session"]["maintenance"]["mode"] == "warn"
    assert "sk-sess1" not in json.dumps(record)
