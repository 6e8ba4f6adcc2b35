"""The runner's books against the scheduler's truth, after each executed step.

``runner_books``: the persistent batch's rows are exactly this step's scheduled IDs, each once
(#23440's symptom is an ID appended twice, gpu_input_batch.py ``add_request``); every
``runner.requests`` entry is a request the scheduler holds or finished and has not yet told
the runner (``Scheduler.finished_req_ids``, shipped with the next SchedulerOutput), and its
state is the incarnation the scheduler holds under that ID (#15041: a stale state kept).

``input_errors``: row by row, the model input the runner built (``input_ids`` / ``positions``,
what ``_prepare_inputs`` wrote, async carry-over included) against the scheduled Request: its
positions start at the tokens it had computed before this step (``num_computed_tokens`` minus
this step's count: ``_update_after_schedule`` has already advanced it), a prompt position holds
the prompt's token, an output position the output the scheduler has recorded, or, while that
output is still in flight (async placeholder), a token of the same incarnation. With
speculative decoding a row's drafts are guesses (any token; the network rejects a wrong one),
so only their positions are checked, and the row's first position is the runner's, bounded by
the scheduler's count: the drafts of the step in flight count as computed until its output
tells the scheduler how many were rejected. This is weaker than the exact check: a runner
that failed to take back rejected drafts would put its row at most that many positions late
unseen.
"""

from __future__ import annotations

from typing import Any

from racesim.engine_vllm.engine.views import Vocabulary

__all__ = ["runner_books", "input_errors"]


def runner_books(real: Any, sched: Any, so: Any, inc_of: Any) -> list[str]:
    runner = real.runner
    batch = runner.input_batch
    rows = batch.req_ids[:batch.num_reqs]
    problems: list[str] = []
    seen = set(rows)
    if len(seen) != len(rows):
        seen = set()
        for rid in rows:
            if rid in seen:
                problems.append(f"batch row {rid!r} appears twice")
            seen.add(rid)
    scheduled = so.num_scheduled_tokens
    if so.total_num_scheduled_tokens and seen != scheduled.keys():
        for rid in sorted(seen - set(scheduled)):
            problems.append(f"batch row {rid!r} is not scheduled this step")
        for rid in sorted(set(scheduled) - seen):
            problems.append(f"scheduled {rid!r} has no batch row")
    requests = sched.requests
    pending = sched.finished_req_ids
    for rid, state in runner.requests.items():
        req = requests.get(rid)
        if req is None or req.is_finished():
            if rid not in pending:
                problems.append(f"runner holds {rid!r}, which the scheduler no longer has")
            continue
        mine, theirs = real.inc_of_state(state), inc_of(req)
        if mine and theirs and mine != theirs:
            problems.append(f"runner state of {rid!r} is inc {mine}, the scheduler's inc "
                            f"{theirs}")
    return problems


def input_errors(real: Any, sched: Any, inc_of: Any,
                 so: Any = None) -> dict[str, list[list[Any]]]:
    """Request ID -> ``[position, token, what]`` for each wrong input of its row.
    ``so``: the step's SchedulerOutput (read with speculative decoding)."""
    runner = real.runner
    speculative = real.verifier is not None and so is not None
    scheduled = so.num_scheduled_tokens if speculative else {}
    drafted = so.scheduled_spec_decode_tokens if speculative else {}
    batch = runner.input_batch
    n = batch.num_reqs
    if n == 0:
        return {}
    qsl, ids, pos = real.model_inputs()
    end = qsl.item(n)
    all_ids = ids[:end].tolist()
    all_pos = pos[:end].tolist()
    requests = sched.requests
    vocab = real.vocab
    base = Vocabulary.BASE
    out: dict[str, list[list[Any]]] = {}
    req_ids = batch.req_ids
    for i in range(n):
        rid = req_ids[i]
        req = requests.get(rid)
        if req is None:
            continue  # runner_books reports it
        inc = inc_of(req)
        lo, hi = qsl.item(i), qsl.item(i + 1)
        start = req.num_computed_tokens - (hi - lo)
        if speculative and lo < hi:
            # the scheduler counts the in-flight drafts as computed (optimistic) and the runner
            # trims drafts its drafter did not propose: the true start is at most the
            # scheduler's count before this step, and the runner corrects it from the rejected
            # drafts (0.20 gpu_model_runner.py:1952-1972)
            start = all_pos[lo]
            bound = req.num_computed_tokens - scheduled.get(rid, 0)
            if start > bound:
                out[rid] = [[start, all_ids[lo], f"position {start}, past the scheduler's "
                                                 f"{bound} computed tokens"]]
                continue
            # the row's drafts (what the runner kept of them: it trims, never adds) are
            # guesses the network verifies, not the request's tokens: positions only
            real_tokens = scheduled.get(rid, 0) - len(drafted.get(rid, ()))
            drafts_from = lo + max(real_tokens, 1)
        else:
            drafts_from = hi
        prompt = req.prompt_token_ids
        outputs = req.output_token_ids
        np_ = len(prompt)
        bad: list[list[Any]] = []
        for j in range(lo, hi):
            p, t = all_pos[j], all_ids[j]
            want_p = start + (j - lo)
            if p != want_p:
                bad.append([p, t, f"position {p}, its true position is {want_p}"])
                continue
            if j >= drafts_from:
                continue
            if p < np_:
                if t != prompt[p]:
                    bad.append([p, t, f"the prompt has {prompt[p]} there"])
                continue
            k = p - np_
            if k < len(outputs) and outputs[k] >= 0:
                if t != outputs[k]:
                    bad.append([p, t, f"output {k} is {outputs[k]}"])
                continue
            if t < base:
                bad.append([p, t, f"output {k} in flight, a token of no incarnation"])
            elif vocab.inc_of(t) != inc:
                bad.append([p, t, f"output {k} in flight is inc {vocab.inc_of(t)}'s token"])
        if bad:
            out[rid] = bad
    return out
