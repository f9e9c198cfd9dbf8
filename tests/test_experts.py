"""Experts demonstrate through every CLI with that CLI's own shell tool, and SFT trains a CLI's prompt once per step."""

import dataclasses
import json

import numpy as np
import pytest

from harness_env.harnesses.base import get_harness
from harness_env.rl import cli_learning, experts
from research.data.pipeline import PipelineConfig, TreeItem, merge_items, to_tree
from research.data.shards import GroupRecord
from research.shim.render import render_header
from research.trees.synthetic import make_group


def _tool(name: str, *params: str) -> dict:
    props = {p: {"type": "string"} for p in params}
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}


TOOLS = {"codex": [_tool("exec_command", "cmd"), _tool("apply_patch", "input")],
         "claude_code": [_tool("Task", "prompt"), _tool("Bash", "command"), _tool("Read", "file_path")],
         "openclaw": [_tool("read", "path"), _tool("exec", "command")],
         "opencode": [_tool("bash", "command", "description"), _tool("todowrite", "todos")],
         "reference": [_tool("bash", "command")]}
QUERY = "<|im_start|>user\nWrite one word into out.txt (3).<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("harness", sorted(TOOLS))
def test_the_expert_calls_the_shell_tool_of_the_cli_that_asks(harness):
    prompt = render_header("You are an agent.", TOOLS[harness]) + QUERY
    assert experts.harness_of_prompt(prompt) == harness
    reply = experts.readdress(cli_learning.expert_reply(prompt), harness)
    call = json.loads(reply.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    shell = get_harness(harness).shell_call("CMD")
    assert call["name"] == shell["name"] and set(call["arguments"]) == set(shell["arguments"])
    assert call["arguments"][next(iter(set(shell["arguments"]) - {"description"}))].endswith("> out.txt")


def test_readdress_leaves_plain_answers_and_other_tools_alone():
    other = '<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n</tool_call>'
    assert experts.readdress("Done.", "codex") == "Done."
    assert experts.readdress(other, "codex") == other
    assert experts.readdress('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>',
                             "reference").count('"bash"') == 1


def test_the_expert_engine_tells_the_cli_the_policy_engines_context_window():
    """The CLIs shape their prompts by the window they are told (Codex lists fewer skills under a smaller one): an
    expert engine with another window than the policy's would teach a prompt the policy never sees."""
    from research.models.tokenizer import load_tokenizer

    engine = experts.expert_engine("make_file", load_tokenizer(None), max_context=10240)
    assert engine.max_context == 10240
    with pytest.raises(TypeError):
        experts.expert_engine("make_file", load_tokenizer(None))  # no default window to forget


def _items(n: int, cfg: PipelineConfig) -> list[TreeItem]:
    """n groups (different tasks) whose prompts share one long harness prefix, as demonstrations through a CLI do."""
    rng = np.random.default_rng(0)
    prefix = rng.integers(1, 50, size=300).tolist()
    items = []
    for g in range(n):
        calls, results = make_group(rng, group_id=f"demo{g}", sessions=1, turns=2, p_rewrite=0.0, p_trunc=0.0)
        for c in calls:
            c.prompt_ids = prefix + c.prompt_ids
        items.append(to_tree(GroupRecord(f"demo{g}", "codex", calls, results), cfg))
    return items


def test_merged_demonstrations_hold_every_call_and_train_the_shared_prefix_once():
    cfg = PipelineConfig(vocab_size=64)
    items = _items(8, cfg)
    (merged,) = merge_items(items + items[:2], cfg)  # a group seen twice in one step counts once
    separate = sum(it.tree.num_nodes for it in items)
    assert len(merged.tree.calls) == sum(len(it.tree.calls) for it in items) == 16
    assert merged.tree.num_nodes <= separate - 7 * 300  # the 300-token prefix once instead of 8 times
    # every call's prompt + completion is a root path of the merged tree
    for it in items:
        for c in it.group.calls:
            info = next(i for i in merged.tree.calls if i.call_id == c.call_id)
            path = merged.tree.path(info.end_node)
            assert merged.tree.tokens[path].tolist() == c.prompt_ids + c.completion_ids


def test_merge_keeps_harnesses_apart():
    cfg = PipelineConfig(vocab_size=64)
    items = _items(2, cfg)
    other = items[1].group
    calls = [dataclasses.replace(c, harness="claude_code") for c in other.calls]
    results = [dataclasses.replace(r, harness="claude_code") for r in other.results]
    items[1] = to_tree(GroupRecord(other.group_id, "claude_code", calls, results), cfg)
    assert sorted(t.tree.harness for t in merge_items(items, cfg)) == ["claude_code", "codex"]


def test_steps_to_threshold_needs_a_window_mean():
    from harness_env.rl.cli_learning import steps_to

    assert steps_to([0.1, 0.9, 0.2, 0.8, 0.8, 0.9], 0.8) == 6  # one high step is not a crossing
    assert steps_to([0.8, 0.8, 0.8], 0.8) == 3
    assert steps_to([0.5] * 10, 0.8) is None and steps_to([0.9], 0.8) is None


def test_plot_curves_writes_a_png(tmp_path):
    from harness_env.rl.cli_learning import plot_curves

    out = plot_curves({"codex": [[0.1, 0.5, 0.9, 0.9], [0.2, 0.4, 0.8, 0.9]]}, tmp_path / "c.png",
                      controls={"codex": [[0.1, 0.0, 0.0]]})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
