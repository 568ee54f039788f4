"""The embedded synthetic world: determinism, names, one place per fact, consistent chains, BM25 retrieval."""

from __future__ import annotations

import json
import time

import bm25s
import pytest
from bm25s.stopwords import STOPWORDS_EN

from mempo.data.synthetic import SPLITS, SyntheticWorld

# An independent list of common English words (and a few real place names) that an invented name must not equal.
COMMON_WORDS = set(
    """
    the and for are but not you all any can her was one our out day get has him his how man new now old see two
    way who boy did its let put say she too use time year people good first life child world school state family
    student group country problem hand part place case week company system program question work government number
    night point home water room mother area money story fact month lot right study book word business issue side
    kind head house service friend father power hour game line end member law car city community name president
    team minute idea kid body information back parent face others level office door health person art war history
    party result change morning reason research girl guy moment air teacher force education foot boy age policy
    music market sense nation plan college interest death experience effect class control care field development
    role effort rate heart drug show leader light voice wife police mind price report decision son view relationship
    town road arm difference value building action model season society tax director position player record paper
    space ground form event official matter center couple site project activity star table need court oil situation
    cost industry figure street image phase data picture piece land river lemon melon salon baron radar solar sugar
    motor pilot robot total metal model local final animal banana potato tomato panama manila osaka lima paris
    milan dakar kabul baku riga sofa soda tuna pasta drama zebra koala llama tiger lion seven eleven never river
    silver open often even origin unit moment senator holiday memory mirror pirate parade debate rebel label
    """.split()
)


@pytest.fixture(scope="module")
def world() -> SyntheticWorld:
    return SyntheticWorld.generate(0)


def name_tokens(world: SyntheticWorld) -> list[str]:
    tokens = [c.name for c in world.countries] + [c.name for c in world.cities] + [o.stem for o in world.orgs]
    return tokens + [part for p in world.people for part in p.name.split()]


def test_same_seed_same_world_different_seed_different_world(world: SyntheticWorld) -> None:
    again = SyntheticWorld.generate(0)
    assert again == world
    assert again.passages() == world.passages()
    assert again.all_questions() == world.all_questions()
    other = SyntheticWorld.generate(1)
    assert set(name_tokens(other)) != set(name_tokens(world))
    assert other.passages() != world.passages()


def test_default_world_is_small_and_fast() -> None:
    start = time.perf_counter()
    w = SyntheticWorld.generate(3)
    passages, questions = w.passages(), w.all_questions()
    # 1 s is ~50x the measured time: the bound catches a blow-up, not machine noise.
    assert time.perf_counter() - start < 1.0
    assert 200 <= len(passages) <= 500
    assert len(questions) > 1000


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_names_are_unique_invented_words(seed: int) -> None:
    w = SyntheticWorld.generate(seed)
    tokens = name_tokens(w)
    lowered = [t.lower() for t in tokens]
    assert len(set(lowered)) == len(lowered), "every name token is unique across the world"
    assert all(t.isalpha() and len(t) >= 4 and t == t.capitalize() for t in tokens)
    assert not set(lowered) & COMMON_WORDS
    assert not set(lowered) & set(STOPWORDS_EN)
    assert len({o.name for o in w.orgs}) == len(w.orgs)


def test_passages_follow_the_search_r1_convention(world: SyntheticWorld, tmp_path) -> None:
    passages = world.passages()
    n_entities = len(world.people) + len(world.orgs) + len(world.cities) + len(world.countries)
    assert len(passages) == n_entities
    assert len({p["id"] for p in passages}) == len(passages)
    for p in passages:
        title, text = p["contents"].split("\n", 1)
        assert title.startswith('"') and title.endswith('"') and text
    path = world.write_corpus(tmp_path / "corpus" / "world.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == passages


def test_every_fact_is_stated_in_exactly_the_passage_its_hop_points_to(world: SyntheticWorld) -> None:
    passages = {p["id"]: p["contents"] for p in world.passages()}
    for q in world.all_questions():
        for hop in q.hops:
            contents = passages[hop.passage_id]
            assert contents.startswith(f'"{hop.entity}"\n')
            assert hop.fact in contents and hop.answer in hop.fact
            holders = [pid for pid, text in passages.items() if hop.fact in text]
            assert holders == [hop.passage_id], f"{hop.fact!r} stated in {holders}"


def test_chains_are_consistent(world: SyntheticWorld) -> None:
    questions = world.all_questions()
    assert len({q.question.qid for q in questions}) == len(questions)
    assert len({q.question.question for q in questions}) == len(questions)
    by_hops: dict[int, int] = {}
    for q in questions:
        by_hops[len(q.hops)] = by_hops.get(len(q.hops), 0) + 1
        assert q.hops[0].entity in q.question.question
        assert q.hops[-1].answer == q.question.answers[0]
        assert not any(alias in q.question.question for alias in q.question.answers), "the question gives it away"
        assert q.template == ".".join(h.relation for h in q.hops)
        for hop in q.hops:
            assert hop.query == hop.entity
        for prev, nxt in zip(q.hops, q.hops[1:]):
            assert nxt.entity == prev.answer, "each hop looks up the entity the previous hop found"
    assert set(by_hops) == {1, 2} and min(by_hops.values()) > 100
    years = [q for q in questions if q.template.endswith("year")]
    assert years and all(q.question.answers[0].isdigit() for q in years)
    employers = [q for q in questions if q.template == "employer"]
    assert all(
        len(q.question.answers) == 2 and q.question.answers[0].startswith(q.question.answers[1]) for q in employers
    )


def test_founding_follows_birth(world: SyntheticWorld) -> None:
    for org in world.orgs:
        founder = world.people[org.founder]
        assert founder.birth_year + 25 <= org.founded_year <= 2020
    assert len({org.founder for org in world.orgs}) == len(world.orgs)


def test_splits_are_disjoint_deterministic_and_cover_everything(world: SyntheticWorld) -> None:
    splits = {s: world.questions(s, seed=7) for s in SPLITS}
    qids = {s: {q.question.qid for q in qs} for s, qs in splits.items()}
    assert not qids["train"] & qids["val"] and not qids["train"] & qids["test"] and not qids["val"] & qids["test"]
    assert qids["train"] | qids["val"] | qids["test"] == {q.question.qid for q in world.all_questions()}
    assert len(qids["val"]) > 0.05 * len(qids["train"])
    assert world.questions("test", seed=7) == splits["test"]
    assert {q.question.qid for q in world.questions("test", seed=8)} != qids["test"]
    with pytest.raises(ValueError, match="split must be one of"):
        world.questions("dev", seed=0)
    with pytest.raises(ValueError, match="fractions"):
        world.questions("train", seed=0, fractions=(0.9, 0.2, 0.1))


def test_bad_sizes_and_a_tiny_world() -> None:
    with pytest.raises(ValueError, match="n_people >= n_orgs"):
        SyntheticWorld.generate(0, n_people=2, n_orgs=3)
    with pytest.raises(ValueError, match="n_cities >= n_countries"):
        SyntheticWorld.generate(0, n_cities=1, n_countries=2)
    tiny = SyntheticWorld.generate(0, n_people=3, n_orgs=2, n_cities=2, n_countries=1)
    assert len(tiny.passages()) == 8
    assert all(q.hops[-1].answer == q.question.answers[0] for q in tiny.all_questions())


def test_bm25_retrieves_every_hop_target_at_rank_1(world: SyntheticWorld) -> None:
    passages = world.passages()
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize([p["contents"] for p in passages], show_progress=False), show_progress=False)
    hops = sorted({(h.query, h.passage_id) for q in world.all_questions() for h in q.hops})
    assert len(hops) == len(passages), "every entity is some hop's target"
    docs, _ = retriever.retrieve(bm25s.tokenize([q for q, _ in hops], show_progress=False), k=1, show_progress=False)
    misses = [(query, pid, passages[docs[i, 0]]["id"]) for i, (query, pid) in enumerate(hops)
              if passages[docs[i, 0]]["id"] != pid]  # fmt: skip
    assert not misses
