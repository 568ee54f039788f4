"""The real-data path end to end with nothing downloaded: the synthetic world exported in the formats real
data comes in (Search-R1 corpus, FlashRAG jsonl, MEM1 parquet, teacher JSONL), served by a separate process that
speaks Search-R1's /retrieve protocol, then the real-data guide's commands (docs/guide/real-data.md, the block a user
copies), read from its block and shrunk to the tiny model, run one after the other: warm start, 2 RL steps,
evaluation."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from scripted import ScriptedSampler

from mempo.core.format import format_turn
from mempo.core.tasks import Task
from mempo.data.export import main as export_main
from mempo.data.qa_files import load_qa_items
from mempo.lm.loading import load_tokenizer
from mempo.rollout.agent import collect
from mempo.rollout.retrievers import HTTPRetriever
from mempo.stages import run_stage
from mempo.stages.builders import build_builder, build_env, build_tasks, group
from mempo.stages.config import compose_config

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide" / "real-data.md"  # where the user reads the commands
GUIDE_PORT = "127.0.0.1:8000"
PINNED = ["env.topk=2", "env.max_passage_tokens=64", "env.max_obs_tokens=null"]  # the synthetic defaults
# What the test adds to the guide's commands: a tiny model, a few tasks, short turns (later overrides win).
SHRINK = {
    "sft": ["sampler=hf", "sft.max_steps=2", "sft.batch_size=4"],
    "rl": ["sampler=hf", "trainer.max_steps=2", "data.batch_size=2", "data.group_size=2", "agent.max_turns=2"],
    "eval": ["sampler=hf", "eval.num_tasks=2", "agent.max_turns=2", "eval.turn_slack=null"],
}
SHRINK_ALL = ["sampler.max_new_tokens=12"]


def guide_commands(data: Path, runs: Path, port: int) -> list[list[str]]:
    """The real-data guide's command block, one argv per command, with its placeholders substituted."""
    text = GUIDE.read_text()
    block = re.search(r"<!-- real-data-commands -->\n```bash\n(.*?)```", text, re.S)
    assert block, f"{GUIDE.relative_to(ROOT)} has no real-data command block"
    subs = {"DATA": str(data), "RUNS": str(runs), "MODEL": "tiny", GUIDE_PORT: f"127.0.0.1:{port}"}
    subs["--port 8000"] = f"--port {port}"
    out = []
    for line in block.group(1).splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        for key, value in subs.items():
            line = line.replace(key, value)
        out.append(shlex.split(line))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_source(tasks: list[Task]) -> list[Task]:
    return [Task(t.task_id, tuple(replace(q, source="") for q in t.objectives)) for t in tasks]


def script(text: str) -> str:
    """Search objective 1, then objective 2 (read from the numbered question lines), then answer."""
    asked = re.findall(r"^\((\d)\) (.*)$", text, re.M)
    if "step two" in text:
        return format_turn("step three", "done", "answer", "x; y")
    if "step one" in text:
        return format_turn("step two", "next", "search", asked[1][1])
    return format_turn("step one", "first", "search", asked[0][1])


def test_real_data_path_end_to_end(tmp_path, tiny_path):
    data, runs, port = tmp_path / "data", tmp_path / "runs", free_port()
    export, serve, *stages = guide_commands(data, runs, port)
    assert export[:3] == ["python", "-m", "mempo.data.export"]
    assert serve[:3] == ["python", "-m", "mempo.rollout.retrieval_server"]
    assert export_main(export[3:]) == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen([sys.executable, *serve[1:]], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/retrieve"
    try:
        HTTPRetriever(url).wait_ready(60, say=lambda line: None, poll_s=0.2)
        synthetic = compose_config("model=tiny", *PINNED)
        files = compose_config(
            "model=tiny", "data=qa_files", f"data.train_files=[{data}/train.jsonl]",
            f"data.val_files=[{data}/val.jsonl]", "env=http", f"env.url={url}", *PINNED,
        )  # fmt: skip

        # The tasks: FlashRAG files composed as in process; MEM1's parquet rows are the in-process tasks as they are.
        in_process = build_tasks(synthetic, "val")
        assert no_source(build_tasks(files, "val")) == in_process
        assert {q.source for t in build_tasks(files, "val") for q in t.objectives} == {"synthetic"}
        mem1 = load_qa_items(data / "val_mem1.parquet")

        def texts(tasks: list[Task]) -> list:  # MEM1's layout carries no question ids
            return [[(q.question, q.answers) for q in t.objectives] for t in tasks]

        assert texts(mem1) == texts(in_process)
        assert no_source(build_tasks(files, "train", num_tasks=5)) == build_tasks(synthetic, "train", num_tasks=5)

        # A scripted policy sees byte-identical prompts and <information> blocks through both paths.
        tokenizer = load_tokenizer(tiny_path)
        seen = {}
        for name, cfg in (("in_process", synthetic), ("files", files)):
            sampler = ScriptedSampler(tokenizer, script)
            search = build_env(cfg, tokenizer)
            batch = collect(
                sampler, search, in_process[:6], 1, build_builder(cfg, tokenizer), group(cfg, "agent"),
                sampling=group(cfg, "sampler").sampling(seed=0),
            )  # fmt: skip
            queries = [s.parsed.argument for t in batch.trajectories for s in t.turns if s.parsed.action == "search"]
            seen[name] = (sampler.prompts, search.search(queries), queries)
        assert len(seen["files"][2]) == 12 and seen["files"] == seen["in_process"]
        assert all("<information>Doc 1 (Title: " in p for p in seen["files"][0][6:])

        # The guide's commands: warm start, 2 RL steps, evaluation, purely from the files and the server.
        summaries = {}
        for argv in stages:
            assert argv[0] == "python" and argv[1] in ("experiments/run.py", "experiments/eval.py")
            overrides = argv[2:] + (["stage=eval"] if argv[1].endswith("eval.py") else [])
            stage = next(o.split("=", 1)[1] for o in reversed(overrides) if o.startswith("stage="))
            summaries[stage] = run_stage(compose_config(*overrides, *SHRINK[stage], *SHRINK_ALL))
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert summaries["sft"]["trajectories"] == 8 and summaries["rl"]["steps"] == 2
    rows = summaries["eval"]["rows"]
    assert [r["objectives"] for r in rows] == [2, 4, 6, 8, 10] and all(r["tasks"] == 2 for r in rows)
    assert all("em_mem1" in r for r in rows)
    records = [json.loads(line) for line in (runs / "eval" / "eval" / "results.jsonl").read_text().splitlines()]
    assert {r["data_source"] for r in records} == {"synthetic"} and len(records) == 10
