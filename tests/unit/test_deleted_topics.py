"""When a tiered topic counts as deleted: repeated answers, observed time, persisted across restarts."""

from __future__ import annotations

from dataclasses import asdict

from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.policy.deleted_topics import MIN_CHECKS, Absence, counted_gap_ms, observe

ID, NAME = "mXjDWYvGQ3SdP7gQi3DrqA", "orders"
NEW_ID = "f7________8AAAAAAAAD_w"
GRACE = 60_000
GAP = counted_gap_ms(GRACE)

# what one answer from Kafka says about the name: absent, present, re-created (other id), no evidence
ANSWERS = {"absent": {NAME: None}, "present": {NAME: ID}, "recreated": {NAME: NEW_ID}, "silent": {}}


def run(steps: list[tuple[int, str]], restart_every: int = 0) -> tuple[dict[str, Absence], list[bool]]:
    """Feed answers at the given times; optionally drop and reload the absences (a restart) as the
    janitor does through its JSON file. Returns the last absences and whether it was due after each."""
    absences: dict[str, Absence] = {}
    due = []
    now = 1_000_000
    for i, (step_ms, kind) in enumerate(steps):
        now += step_ms
        absences = observe(absences, {ID: NAME}, ANSWERS[kind], now, GAP)
        due.append(ID in absences and absences[ID].due(GRACE))
        if restart_every and i % restart_every == 0:
            absences = {k: Absence(**asdict(v)) for k, v in absences.items()}
    return absences, due


steps_strategy = st.lists(
    st.tuples(st.integers(-5_000, 400_000), st.sampled_from(sorted(ANSWERS))), min_size=1, max_size=60
)


@settings(max_examples=300, deadline=None)
@given(steps=steps_strategy)
def test_due_needs_enough_absent_answers_over_enough_observed_time(steps: list[tuple[int, str]]) -> None:
    _, due = run(steps)
    for i, is_due in enumerate(due):
        if not is_due:
            continue
        # walk back over the run of answers that led here: no "present" since the first absent one
        run_steps = []
        for step_ms, kind in reversed(steps[: i + 1]):
            if kind == "present":
                break
            run_steps.append((step_ms, kind))
        absent = [s for s in run_steps if s[1] != "silent"]
        assert len(absent) >= MIN_CHECKS
        assert sum(max(0, s) for s, _ in run_steps) >= GRACE  # at least the grace of wall time passed


@settings(max_examples=300, deadline=None)
@given(steps=steps_strategy)
def test_observed_time_never_exceeds_the_time_that_passed_and_restarts_change_nothing(
    steps: list[tuple[int, str]],
) -> None:
    plain, due = run(steps)
    restarted, due_restarted = run(steps, restart_every=2)
    assert plain == restarted and due == due_restarted  # persisted and reloaded: the same evidence
    absence = plain.get(ID)
    if absence is not None:
        assert absence.observed_ms <= sum(max(0, s) for s, _ in steps[1:])


def test_one_answer_showing_the_topic_forgets_the_absence() -> None:
    steps = [(0, "absent")] + [(GAP, "absent")] * 10
    absences, due = run(steps)
    assert due[-1] and absences[ID].checks == 11
    absences, due = run([*steps[:-1], (GAP, "present")])
    assert ID not in absences and not due[-1]


def test_silent_answers_neither_count_nor_forget() -> None:
    absences, due = run([(0, "absent"), (GAP, "silent"), (GAP, "silent"), (GAP, "absent")])
    assert absences[ID].checks == 2 and absences[ID].observed_ms == 0  # the step since the last check was > GAP
    assert not any(due)


def test_a_pause_longer_than_the_counted_gap_does_not_shortcut_the_grace() -> None:
    absences, due = run([(0, "absent"), (1_000, "absent"), (10 * GRACE, "absent")])
    assert absences[ID].checks == 3 and absences[ID].observed_ms == 1_000 and not due[-1]


def test_a_recreated_name_counts_against_the_old_id() -> None:
    steps = [(0, "recreated")] + [(GAP, "recreated")] * 3
    absences, due = run(steps)
    assert due[-1] and absences[ID].observed_ms == 3 * GAP


def test_a_clock_step_back_counts_nothing() -> None:
    absences, _ = run([(0, "absent"), (-3_000, "absent"), (2_000, "absent")])
    assert absences[ID].observed_ms == 2_000 and absences[ID].checks == 3


def test_ids_without_remote_data_are_dropped() -> None:
    absences = observe({ID: Absence(NAME, 1, 2)}, {}, {}, 3)
    assert absences == {}
