"""The synthetic world in the formats real data comes in, so the real-data path runs with nothing downloaded.

    python -m mempo.data.export OUT [--world-seed 0] [--seed 0] [--teacher-tasks 8]

Writes into OUT:
- ``corpus.jsonl``: the search corpus as Search-R1's wiki-18 lines, ``{"id", "contents": "\\"Title\\"\\ntext"}``
  (the training world's passages and its held-out world's, as the in-process BM25 index holds them);
- ``train.jsonl``, ``val.jsonl``, ``test.jsonl``: FlashRAG question files (``id``, ``question``,
  ``golden_answers``, ``data_source``) of the synthetic splits, in ``split_questions`` order;
- ``train_mem1.parquet``, ``val_mem1.parquet``: MEM1's multi-objective layout (``data_source``, a chat
  ``prompt`` ending "Answer the following questions: q1?; q2?", ``reward_model.ground_truth.target``,
  ``extra_info``) of the 2-objective tasks ``build_tasks`` composes in process (one pass over each split);
- ``teacher.jsonl``: the synthetic oracle's trajectories on training tasks, in the teacher format a warm start
  on real data needs (``mempo.data.oracle``).

Same world seed and seed as a synthetic run, same tasks (``tests/test_real_data.py`` checks it, and that a policy
sees byte-identical prompts and ``<information>`` blocks through the files and a Search-R1-protocol server).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from mempo.core.tasks import Question, Task
from mempo.data.compose import compose_tasks
from mempo.data.oracle import oracle_dataset, save_trajectories_jsonl
from mempo.data.qa_files import MEM1_LEAD
from mempo.data.synthetic import SyntheticWorld, split_questions

SOURCE = "synthetic"
MEM1_INSTRUCTION = "Search as needed, then answer every question in one <answer>, separated by ';'. "


def flashrag_row(q: Question) -> dict:
    return {"id": q.qid, "question": q.question, "golden_answers": list(q.answers), "data_source": SOURCE}


def mem1_row(task: Task, index: int, split: str) -> dict:
    """One task as MEM1's ``qa_search_*_merge_multi.py`` writes it (questions ending in "?", joined by "; ")."""
    for q in task.objectives:
        if not q.question.endswith("?") or "?; " in q.question:
            raise ValueError(f"question {q.qid!r} cannot round-trip MEM1's layout: {q.question!r}")
    text = MEM1_INSTRUCTION + MEM1_LEAD + "; ".join(q.question for q in task.objectives)
    return {
        "data_source": SOURCE,
        "prompt": [{"role": "user", "content": text}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": [list(q.answers) for q in task.objectives]}},
        "extra_info": {"split": split, "index": index},
    }


def write_mem1_parquet(path: Path, tasks: Sequence[Task], split: str) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([mem1_row(t, i, split) for i, t in enumerate(tasks)]), path)
    return path


def export_synthetic(out: str | Path, *, world_seed: int = 0, seed: int = 0, teacher_tasks: int = 8) -> dict[str, Path]:
    """Write the files of the module docstring into ``out`` -> name -> path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    world = SyntheticWorld.generate(world_seed)
    files = {"corpus": world.write_corpus(out / "corpus.jsonl", with_heldout=True)}
    for split in ("train", "val", "test"):
        questions = [c.question for c in split_questions(world, split, seed=seed)]
        files[split] = out / f"{split}.jsonl"
        files[split].write_text("".join(json.dumps(flashrag_row(q)) + "\n" for q in questions), encoding="utf-8")
        if split != "test":  # the tasks build_tasks composes (same pool, seed and prefix)
            tasks = compose_tasks(questions, 2, seed=seed, prefix=f"{split}-n2")
            files[f"{split}_mem1"] = write_mem1_parquet(out / f"{split}_mem1.parquet", tasks, split)
    files["teacher"] = out / "teacher.jsonl"
    save_trajectories_jsonl(files["teacher"], oracle_dataset(world, "train", 2, num_tasks=teacher_tasks, seed=seed))
    return files


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--world-seed", type=int, default=0, help="data.world_seed of the synthetic run to mirror")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic run to mirror")
    ap.add_argument("--teacher-tasks", type=int, default=8, help="oracle trajectories in teacher.jsonl")
    args = ap.parse_args(argv)
    files = export_synthetic(args.out, world_seed=args.world_seed, seed=args.seed, teacher_tasks=args.teacher_tasks)
    for name, path in files.items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
