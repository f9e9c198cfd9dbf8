"""Who caused a failed rollout: the policy (trained on, with `rl.failure_reward`), the infrastructure (retried,
then dropped and counted) or the task (dropped and counted). The rule, one status at a time:

- timeout, disk_limit: the policy's (its commands ran past the time or filled the disk).
- harness_error: the policy's when the harness ran, the policy had answered at least once, and neither the shim
  nor the engine reported a fault in the rollout; the infrastructure's otherwise (the adapter refused to start
  it, it died before the first model call, an engine error or overload, a first prompt that does not fit the
  engine's context: a configuration mismatch). A context overflow of a prompt that continues an earlier
  call is the policy's: its own turns filled the context, as a timeout is its own.
- reward_error: the policy's when the task's untouched workspace grades without error (checked once per task
  and runner); the task's otherwise.
- task_error: the task's. infra_error: the infrastructure's.
- replay_mismatch (a forked child, harness_env/rl/branching.py): the infrastructure's. The environment did not
  reproduce the parent's state (a clock, a random id in a tool output) before the policy made any new decision.

Why a rule and not a list of scored statuses: dropping every failure but timeouts let a policy escape its negative
advantage by breaking the harness (`kill -9 $PPID`) or the checker (`chmod 000 .`), so GRPO moved probability from
honest failure to sabotage; scoring every failure as 0 instead would punish the policy for a crashed engine.
"""

from __future__ import annotations

POLICY, INFRA, TASK = "policy", "infra", "task"
CAUSES = (POLICY, INFRA, TASK)


def _serving_fault(faults: list[str]) -> str | None:
    """The first fault that is the serving side's: anything but a context overflow of a prompt that continues an
    earlier call of its session ("context_length@INDEX:TOKENS:continued")."""
    for f in faults:
        if not (f.startswith("context_length@") and f.endswith(":continued")):
            return f
    return None


def cause_of(status: str, *, ran: bool = True, calls: int = 0, faults: list[str] = (),
             clean_grade: bool | None = None) -> tuple[str | None, str]:
    """(cause, why) of a rollout's `status` (None for "ok"): see the module's table. `ran`: the harness was
    started; `calls`: model calls recorded for it; `faults`: the shim's faults of its sessions; `clean_grade`:
    whether its task's untouched workspace grades without error (None: unknown, counted as the task's)."""
    if status == "ok":
        return None, ""
    if status in ("timeout", "disk_limit"):
        return POLICY, status
    if status == "harness_error":
        fault = _serving_fault(list(faults))
        if not ran:
            return INFRA, "the harness was not started"
        if fault is not None:
            return INFRA, f"serving fault {fault}"
        if calls == 0:
            return INFRA, "the harness failed before its first model call"
        return POLICY, f"the harness failed after {calls} model call(s), no serving fault"
    if status == "reward_error":
        if clean_grade:
            return POLICY, "the untouched workspace grades without error"
        return TASK, "the checker fails on the untouched workspace" if clean_grade is False else "task not checked"
    if status == "task_error":
        return TASK, status
    if status == "replay_mismatch":
        return INFRA, "the replayed prefix diverged from the parent's (nondeterministic environment or harness)"
    return INFRA, status
