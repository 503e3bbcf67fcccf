//! The checker on synthetic histories: each test writes down a small run by hand (times in
//! plain numbers) and asserts what the report and the profiles make of it.

use std::collections::BTreeSet;

use super::testutil::temp_dir;
use super::*;

const RUN: &str = "r";
const MS: u64 = 1_000_000;

fn id(worker: u32, handle: u64) -> HoldId {
    HoldId { worker, handle }
}

/// A run under construction: worker events and both registers.
struct Run {
    events: Vec<Event>,
    fenced: Register,
    shadow: Register,
}

impl Run {
    fn new() -> Self {
        Self {
            events: Vec::new(),
            fenced: Register::new(RegisterKind::Fenced),
            shadow: Register::new(RegisterKind::Shadow),
        }
    }

    fn event(&mut self, t: u64, hold: HoldId, op: Op, phase: Phase) -> &mut Event {
        self.events.push(Event::at(t, RUN, hold, "n", op, phase));
        self.events.last_mut().expect("just pushed")
    }

    /// An acquire invoked at `t - 1ms` that returned ok at `t` with `token`, valid until
    /// `valid_until` (host ns) if given.
    fn acquire(&mut self, t: u64, hold: HoldId, token: u64, valid_until: Option<u64>) {
        self.event(t - MS, hold, Op::Acquire, Phase::Invoke);
        let ok = self.event(t, hold, Op::Acquire, Phase::Ok);
        ok.token = Some(token);
        ok.valid_until = valid_until;
    }

    /// [`acquire`](Self::acquire) of one of `permits` permits of a semaphore named "n".
    fn permit(&mut self, t: u64, hold: HoldId, token: u64, valid_until: Option<u64>, permits: u32) {
        self.acquire(t, hold, token, valid_until);
        for event in self.events.iter_mut().rev().take(2) {
            event.permits = Some(permits);
        }
    }

    fn release(&mut self, t: u64, hold: HoldId) {
        self.event(t, hold, Op::Release, Phase::Invoke);
        self.event(t + MS, hold, Op::Release, Phase::Ok);
    }

    /// Reads both registers (returns the sets) and, separately, writes them: a stale writer
    /// reads, pauses, then writes.
    fn read(&self) -> (BTreeSet<u64>, BTreeSet<u64>) {
        (self.fenced.read("n").set, self.shadow.read("n").set)
    }

    fn write(
        &mut self,
        read: (BTreeSet<u64>, BTreeSet<u64>),
        hold: HoldId,
        token: u64,
        element: u64,
    ) {
        self.fenced.write("n", token, hold, read.0, element);
        self.shadow.write("n", token, hold, read.1, element);
    }

    fn rmw(&mut self, hold: HoldId, token: u64, element: u64) {
        let read = self.read();
        self.write(read, hold, token, element);
    }

    fn input(&self) -> Input {
        Input {
            events: self.events.clone(),
            register: self.fenced.snapshot(),
            shadow: Some(self.shadow.snapshot()),
            residue: Some(vec![]),
            ..Input::default()
        }
    }
}

/// Three workers taking turns properly, two rmw each per hold.
fn clean_run() -> Run {
    let mut run = Run::new();
    let mut t = 100 * MS;
    for round in 0..3u64 {
        for worker in 1..=3u32 {
            let hold = id(worker, round);
            let token = round * 3 + u64::from(worker);
            run.acquire(t, hold, token, Some(t + 2_000 * MS));
            run.rmw(hold, token, token * 10);
            run.rmw(hold, token, token * 10 + 1);
            run.release(t + 10 * MS, hold);
            t += 20 * MS;
        }
    }
    run
}

#[test]
fn a_clean_history_passes_the_clean_profile() {
    let report = check(&clean_run().input());
    assert_eq!(Expect::CLEAN.check(&report), Ok(()), "{report}");
    assert_eq!(report.holds.len(), 9);
    assert!(report.holds.iter().all(|h| h.ended_by == End::Release));
    assert_eq!(report.max_token, Some(9));
    assert_eq!(report.liveness.granted, 9);
    assert_eq!(report.liveness.max_latency.map(|(_, l)| l), Some(MS));
    assert_eq!(report.register.accepted, 18);
    assert!(report.to_string().contains("overlaps: 0\n"), "{report}");
}

#[test]
fn two_overlapping_holds_are_reported_with_their_intervals() {
    let mut run = Run::new();
    run.acquire(100 * MS, id(1, 0), 1, None);
    run.acquire(150 * MS, id(2, 0), 2, None);
    run.release(200 * MS, id(1, 0));
    run.release(300 * MS, id(2, 0));
    let report = check(&run.input());
    assert_eq!(report.overlaps.len(), 1, "{report}");
    let overlap = &report.overlaps[0];
    assert_eq!((overlap.first.id, overlap.second.id), (id(1, 0), id(2, 0)));
    assert_eq!(overlap.name(), "n");
    assert_eq!(overlap.during(), (150 * MS, 200 * MS));
    assert!(report.to_string().contains("for 50.00ms"), "{report}");
    let unmet = Expect::CLEAN.check(&report).unwrap_err();
    assert_eq!(unmet, "overlaps: expected 0, found 1");
    assert_eq!(Expect::NEGATIVE_CONTROL.check(&report), Ok(()));
}

#[test]
fn a_paused_holder_past_its_deadline_does_not_overlap_the_next_grant() {
    // A is frozen from 110ms to 900ms; its guard said valid until 200ms; B is granted at 250ms.
    // A releases only after it resumes.
    let mut run = Run::new();
    run.acquire(100 * MS, id(1, 0), 1, Some(200 * MS));
    run.acquire(250 * MS, id(2, 0), 2, Some(2_250 * MS));
    run.release(400 * MS, id(2, 0));
    run.release(900 * MS, id(1, 0));
    let report = check(&run.input());
    assert!(report.overlaps.is_empty(), "{report}");
    assert_eq!(report.holds[0].ended_by, End::Expired);
    assert_eq!(report.holds[0].end, 200 * MS);

    // Had B been granted before A's deadline, that is an overlap.
    let mut early = Run::new();
    early.acquire(100 * MS, id(1, 0), 1, Some(200 * MS));
    early.acquire(150 * MS, id(2, 0), 2, Some(2_150 * MS));
    assert_eq!(check(&early.input()).overlaps.len(), 1);
}

#[test]
fn an_extension_counts_only_if_confirmed_before_the_deadline() {
    let mut run = Run::new();
    run.acquire(100 * MS, id(1, 0), 1, Some(200 * MS));
    run.event(190 * MS, id(1, 0), Op::Extend, Phase::Ok)
        .valid_until = Some(400 * MS);
    run.event(500 * MS, id(1, 0), Op::Extend, Phase::Ok)
        .valid_until = Some(900 * MS);
    run.acquire(450 * MS, id(2, 0), 2, Some(1_000 * MS));
    run.acquire(350 * MS, id(3, 0), 3, Some(360 * MS));
    let report = check(&run.input());
    let first = &report.holds[0];
    assert_eq!((first.end, first.ended_by), (400 * MS, End::Expired));
    // Hold 3 (granted at 350ms) overlaps hold 1 (extended to 400ms); hold 2 (450ms) does not.
    assert_eq!(report.overlaps.len(), 1, "{report}");
    assert_eq!(report.overlaps[0].second.id, id(3, 0));
}

#[test]
fn lost_signal_and_death_end_holds() {
    let mut run = Run::new();
    run.acquire(100 * MS, id(1, 0), 1, None);
    run.event(150 * MS, id(1, 0), Op::Lost, Phase::Info);
    run.acquire(160 * MS, id(2, 0), 2, None);
    run.acquire(300 * MS, id(3, 0), 3, None);
    let mut input = run.input();
    input.deaths.insert(2, 250 * MS);
    input.nemesis.push(NemesisRecord {
        t: 240 * MS,
        edge: Edge::Stop,
        what: "heal fr-proxy".into(),
    });
    let report = check(&input);
    assert!(report.overlaps.is_empty(), "{report}");
    let ends: Vec<End> = report.holds.iter().map(|h| h.ended_by).collect();
    assert_eq!(ends, [End::Lost, End::Died, End::Open]);
    let recoveries = &report.liveness.recoveries;
    assert_eq!(recoveries[0].after, "heal fr-proxy");
    assert_eq!(recoveries[0].next_grant, Some(60 * MS));
    assert_eq!(recoveries[1].after, "worker 2 died");
    assert_eq!(recoveries[1].next_grant, Some(50 * MS));

    // The liveness bound judges each recovery that a grant followed.
    let lenient = Expect {
        residue: Count::Any,
        shadow_lost: Count::Any,
        overlaps: Count::Any,
        recovery_within: Some(std::time::Duration::from_millis(60)),
        ..Expect::CLEAN
    };
    assert_eq!(lenient.check(&report), Ok(()));
    let strict = Expect {
        recovery_within: Some(std::time::Duration::from_millis(55)),
        ..lenient
    };
    let unmet = strict.check(&report).unwrap_err();
    assert!(
        unmet.contains("recovery: expected the next grant within 55ms after heal fr-proxy"),
        "{unmet}"
    );
    assert!(!unmet.contains("worker 2 died"), "{unmet}");
}

#[test]
fn indeterminate_acquires_are_never_accused() {
    let mut run = Run::new();
    run.acquire(100 * MS, id(1, 0), 1, None);
    // Worker 2's acquire timed out (info); worker 3 died mid-acquire (invoke only).
    run.event(110 * MS, id(2, 0), Op::Acquire, Phase::Invoke);
    run.event(150 * MS, id(2, 0), Op::Acquire, Phase::Info).err = Some("timeout".into());
    run.event(120 * MS, id(3, 0), Op::Acquire, Phase::Invoke);
    // Worker 4 failed cleanly: no hold at all.
    run.event(130 * MS, id(4, 0), Op::Acquire, Phase::Invoke);
    run.event(140 * MS, id(4, 0), Op::Acquire, Phase::Fail);
    run.release(300 * MS, id(1, 0));
    let report = check(&run.input());
    assert!(report.overlaps.is_empty(), "{report}");
    assert_eq!(report.holds.len(), 3);
    assert_eq!(report.holds.iter().filter(|h| !h.determinate).count(), 2);
    let l = &report.liveness;
    assert_eq!((l.granted, l.failed, l.indeterminate), (1, 1, 2));
}

#[test]
fn fencing_refuses_the_stale_write_the_shadow_accepts() {
    // A (token 1) reads and freezes past its deadline; B (token 2) is granted, writes,
    // releases; A wakes and writes.
    let mut run = Run::new();
    run.acquire(100 * MS, id(1, 0), 1, Some(200 * MS));
    let stale_read = run.read();
    run.acquire(300 * MS, id(2, 0), 2, Some(2_300 * MS));
    run.rmw(id(2, 0), 2, 20);
    run.release(400 * MS, id(2, 0));
    run.write(stale_read, id(1, 0), 1, 10);
    run.release(900 * MS, id(1, 0));
    let report = check(&run.input());

    assert_eq!(report.register.rejected.len(), 1, "{report}");
    assert!(report.register.stale_accepted.is_empty());
    assert!(report.register.lost.is_empty());
    let shadow = report.shadow.as_ref().unwrap();
    assert_eq!(shadow.stale_accepted.len(), 1, "{report}");
    assert_eq!(shadow.stale_accepted[0].newer_token, 2);
    assert_eq!(shadow.lost.len(), 1);
    assert_eq!(shadow.lost[0].write.element, 20);
    assert_eq!(Expect::FENCED_FAULT.check(&report), Ok(()));
    let unmet = Expect::CLEAN.check(&report).unwrap_err();
    assert!(
        unmet.contains("stale attempts: expected 0, found 1"),
        "{unmet}"
    );
    assert!(
        unmet.contains("shadow lost updates: expected 0, found 1"),
        "{unmet}"
    );

    // Negative control: the same writes to a register without fencing are caught as stale.
    let mut unfenced = run.input();
    unfenced.register = run.shadow.snapshot();
    let report = check(&unfenced);
    assert_eq!(report.register.stale_accepted.len(), 1, "{report}");
    assert_eq!(report.register.lost.len(), 1);
    let unmet = Expect::FENCED_FAULT.check(&report).unwrap_err();
    assert!(
        unmet.contains("stale accepted: expected 0, found 1"),
        "{unmet}"
    );
}

#[test]
fn a_killed_writers_late_write_is_set_apart_from_lost_updates() {
    // A (token 1) reads and sends its write, and is killed; B (token 2), granted once A's hold
    // ends, reads before A's write arrives, then writes: the set loses A's element.
    let mut run = Run::new();
    run.acquire(100 * MS, id(1, 0), 1, None);
    let a_read = run.read();
    run.acquire(300 * MS, id(2, 0), 2, None);
    let b_read = run.read();
    run.write(a_read, id(1, 0), 1, 10);
    run.write(b_read, id(2, 0), 2, 20);
    run.release(400 * MS, id(2, 0));
    let decided_at = |input: &mut Input, t: u64| {
        for snapshot in [Some(&mut input.register), input.shadow.as_mut()]
            .into_iter()
            .flatten()
        {
            snapshot.log[0].t = t;
        }
    };
    let mut input = run.input();
    input.deaths.insert(1, 200 * MS);

    // A's write arrived after A died: reported apart, not a lost update.
    decided_at(&mut input, 350 * MS);
    let report = check(&input);
    assert!(report.register.lost.is_empty(), "{report}");
    assert_eq!(report.register.lost_after_death.len(), 1, "{report}");
    assert_eq!(report.register.lost_after_death[0].write.element, 10);
    assert_eq!(Expect::CLEAN.check(&report), Ok(()));

    // The same write decided while A lived is a lost update.
    decided_at(&mut input, 150 * MS);
    let report = check(&input);
    assert_eq!(report.register.lost.len(), 1, "{report}");
    assert!(report.register.lost_after_death.is_empty());
    let unmet = Expect::CLEAN.check(&report).unwrap_err();
    assert!(
        unmet.contains("lost updates: expected 0, found 1"),
        "{unmet}"
    );
}

#[test]
fn interleaved_writers_are_reported() {
    let mut shadow = Register::new(RegisterKind::Shadow);
    for (hold, token) in [(id(1, 0), 1), (id(2, 0), 2), (id(1, 0), 1), (id(3, 0), 3)] {
        let base = shadow.read("n").set;
        shadow.write("n", token, hold, base, token);
    }
    let findings = fence::analyse(&shadow.snapshot());
    assert_eq!(findings.interleavings.len(), 1);
    let i = &findings.interleavings[0];
    assert_eq!((i.holder, i.between), (id(1, 0), id(2, 0)));
    // Blockwise turns are fine.
    let mut fenced = Register::new(RegisterKind::Fenced);
    for (hold, token) in [(id(1, 0), 1), (id(1, 0), 1), (id(2, 0), 2), (id(3, 0), 3)] {
        let base = fenced.read("n").set;
        fenced.write("n", token, hold, base, token);
    }
    assert!(fence::analyse(&fenced.snapshot()).interleavings.is_empty());
}

#[test]
fn a_register_breaking_its_own_rule_fails_every_profile() {
    let holder = id(1, 0);
    let write = |token, accepted, t| WriteRecord {
        name: "n".into(),
        token,
        holder,
        element: t,
        accepted,
        max_token_before: None,
        t,
    };
    let mut snapshot = RegisterSnapshot {
        log: vec![write(5, true, 1), write(6, false, 2), write(7, true, 3)],
        ..RegisterSnapshot::default()
    };
    snapshot.sets.insert("n".into(), BTreeSet::from([1, 3]));
    let findings = fence::analyse(&snapshot);
    assert_eq!(findings.wrong_rejections.len(), 1);
    assert_eq!(
        findings.token_conflicts.len(),
        1,
        "{:?}",
        findings.token_conflicts
    );
    let report = Report {
        register: findings,
        ..Report::default()
    };
    let unmet = Expect::ANY.check(&report).unwrap_err();
    assert_eq!(unmet, "register integrity faults: expected 0, found 2");
}

#[test]
fn duplicate_decreasing_and_regressed_tokens_are_reported() {
    let mut run = Run::new();
    let grants = [(1, 10), (2, 11), (3, 11), (4, 9), (5, 12)];
    for (i, (worker, token)) in (0u64..).zip(grants) {
        let t = (100 + i * 100) * MS;
        run.acquire(t, id(worker, 0), token, None);
        run.release(t + 10 * MS, id(worker, 0));
    }
    let mut input = run.input();
    input.earlier_max_token = Some(10);
    let report = check(&input);
    let issues = &report.tokens;
    assert!(issues.contains(&TokenIssue::Duplicate {
        name: "n".into(),
        token: 11,
        holds: (id(2, 0), id(3, 0)),
    }));
    assert!(issues.contains(&TokenIssue::Decreasing {
        name: "n".into(),
        earlier: (id(2, 0), 11),
        later: (id(4, 0), 9),
    }));
    let regressed: Vec<u64> = issues
        .iter()
        .filter_map(|i| match i {
            TokenIssue::NotAboveEarlierRun { hold, .. } => Some(hold.1),
            _ => None,
        })
        .collect();
    assert_eq!(regressed, [10, 9]);
    assert_eq!(issues.len(), 4, "{report}");
    assert_eq!(report.max_token, Some(12));
    let unmet = Expect::CLEAN.check(&report).unwrap_err();
    assert!(
        unmet.contains("token issues: expected 0, found 4"),
        "{unmet}"
    );
}

#[test]
fn unmeasured_checks_fail_unless_the_profile_allows_any() {
    let mut input = clean_run().input();
    input.residue = None;
    input.shadow = None;
    let report = check(&input);
    let unmet = Expect::CLEAN.check(&report).unwrap_err();
    assert!(
        unmet.contains("residue: expected 0, not measured"),
        "{unmet}"
    );
    assert!(
        unmet.contains("shadow lost updates: expected 0, not measured"),
        "{unmet}"
    );
    let relaxed = Expect {
        residue: Count::Any,
        shadow_lost: Count::Any,
        ..Expect::CLEAN
    };
    assert_eq!(relaxed.check(&report), Ok(()));
    assert!(report.to_string().contains("residue: not scanned"));
}

#[test]
fn counts_admit_what_they_say() {
    assert!(Count::Zero.admits(0) && !Count::Zero.admits(1));
    assert!(Count::AtLeast(2).admits(2) && !Count::AtLeast(2).admits(1));
    assert!(Count::AtMost(2).admits(2) && !Count::AtMost(2).admits(3));
    assert!(Count::Exactly(3).admits(3) && !Count::Exactly(3).admits(2));
    assert!(Count::Any.admits(usize::MAX));
}

#[test]
fn a_run_from_files_with_a_torn_line_checks_and_dumps_on_failure() {
    let dir = temp_dir("e2e");
    let run = clean_run();
    for worker in 1..=3u32 {
        let writer = HistoryWriter::open(&worker_file(&dir, worker)).unwrap();
        for event in run.events.iter().filter(|e| e.worker == worker) {
            writer.append(event).unwrap();
        }
    }
    // Worker 3 was killed writing its next acquire.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(worker_file(&dir, 3))
        .unwrap();
    std::io::Write::write_all(&mut file, br#"{"run":"r","worker":3,"pi"#).unwrap();

    let loaded = read_history_dir(&dir).unwrap();
    let mut input = Input {
        events: loaded.records,
        torn: loaded.torn,
        seed: Some(42),
        notes: vec!["synthetic".into()],
        ..run.input()
    };
    let report = Expect::CLEAN.verify(&input, &dir).unwrap();
    assert_eq!(report.torn, 1);
    assert!(report.to_string().contains("torn history lines skipped: 1"));

    input.residue = Some(vec!["n: held by w3".into()]);
    let failure = Expect::CLEAN.verify(&input, &dir).unwrap_err();
    assert!(
        failure.starts_with("residue: expected 0, found 1"),
        "{failure}"
    );
    let dumped = failure.rsplit("history dumped to ").next().unwrap();
    let dumped = std::path::Path::new(dumped);
    let merged = read_jsonl::<Event>(&[dumped.join("history.jsonl")]).unwrap();
    assert_eq!(merged.records.len(), run.events.len());
    assert!(merged.records.windows(2).all(|w| w[0].t <= w[1].t));
    let register = read_jsonl::<WriteRecord>(&[dumped.join("register.jsonl")]).unwrap();
    assert_eq!(register.records.len(), 18);
    assert!(dumped.join("shadow.jsonl").exists() && dumped.join("nemesis.jsonl").exists());
    let notes = std::fs::read_to_string(dumped.join("notes.txt")).unwrap();
    assert!(
        notes.contains("seed: 42") && notes.contains("note: synthetic"),
        "{notes}"
    );
    assert!(
        notes.contains("residue: 1") && notes.contains("n: held by w3"),
        "{notes}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_lost_signal_after_another_grant_is_measured_from_that_grant() {
    let mut run = Run::new();
    // Hold 1's key went at 190ms; hold 2 was granted at 200ms, and 1 learnt at 230ms.
    run.acquire(100 * MS, id(1, 0), 1, Some(10_000 * MS));
    run.acquire(200 * MS, id(2, 0), 2, Some(10_000 * MS));
    run.event(230 * MS, id(1, 0), Op::Lost, Phase::Info);
    // Hold 3 was lost before anyone else held the name: no lateness to report.
    run.acquire(300 * MS, id(3, 1), 3, None);
    run.event(310 * MS, id(3, 1), Op::Lost, Phase::Info);
    let report = check(&run.input());
    let signals = &report.liveness.lost_signals;
    assert_eq!(signals.len(), 1, "{report}");
    assert_eq!(signals[0].hold, id(1, 0));
    assert_eq!(signals[0].superseded_by, id(2, 0));
    assert_eq!(signals[0].latency, 30 * MS);
    assert!(
        report
            .to_string()
            .contains("lost signal: 1 holds learnt of a later grant"),
        "{report}"
    );
}

/// Four permits of a semaphore of `permits` held in a staircase: hold k is granted at
/// (100 + 10k) ms and released at (200 + 10k) ms, so all four are valid from 130 to 200 ms.
fn staircase(permits: u32) -> Run {
    let mut run = Run::new();
    for k in 0..4u64 {
        let hold = id(u32::try_from(k).unwrap() + 1, 0);
        run.permit((100 + 10 * k) * MS, hold, k + 1, None, permits);
        run.rmw(hold, k + 1, k + 1);
        run.release((200 + 10 * k) * MS, hold);
    }
    run
}

#[test]
fn n_permits_held_at_once_are_accepted() {
    let report = check(&staircase(4).input());
    assert!(report.over_limit.is_empty(), "{report}");
    assert!(report.overlaps.is_empty(), "{report}");
    assert_eq!(report.semaphores.get("n"), Some(&4));
    assert_eq!(report.peak_holders.get("n"), Some(&4));
    // The register's refusals and lost adds between concurrent holders are not the lock's.
    assert_eq!(Expect::CLEAN.check(&report), Ok(()), "{report}");
    let apart = report.semaphore_register.as_ref().unwrap();
    assert_eq!(apart.writes, 4);
    assert!(report.register.writes == 0 && report.tokens.is_empty());
    assert!(
        report
            .to_string()
            .contains("semaphores: n (4 permits, at most 4 held at once); over the limit: 0"),
        "{report}"
    );
}

#[test]
fn n_plus_one_permits_held_at_once_are_reported_with_the_holds() {
    let report = check(&staircase(3).input());
    assert_eq!(report.over_limit.len(), 1, "{report}");
    let excess = &report.over_limit[0];
    assert_eq!(excess.limit, 3);
    assert_eq!(excess.name(), "n");
    let ids: Vec<HoldId> = excess.holds.iter().map(|h| h.id).collect();
    assert_eq!(ids, [id(1, 0), id(2, 0), id(3, 0), id(4, 0)]);
    assert_eq!(excess.during(), (130 * MS, 200 * MS));
    assert!(
        report.overlaps.is_empty(),
        "pairs are a lock's finding: {report}"
    );
    let unmet = Expect::CLEAN.check(&report).unwrap_err();
    assert_eq!(unmet, "overlaps: expected 0, found 1");
    assert_eq!(Expect::NEGATIVE_CONTROL.check(&report), Ok(()));
    assert!(
        report
            .to_string()
            .contains("n: 4 holds of a limit of 3 for 70.00ms"),
        "{report}"
    );

    // Each grant beyond the limit is one finding: with two permits, holds 3 and 4 each
    // found two others valid.
    let report = check(&staircase(2).input());
    let sizes: Vec<usize> = report.over_limit.iter().map(|o| o.holds.len()).collect();
    assert_eq!(sizes, [3, 4], "{report}");
}

#[test]
fn permits_that_only_touch_are_not_counted_together() {
    // Three permits of two: the third is granted the very moment the first is released.
    let mut run = Run::new();
    run.permit(100 * MS, id(1, 0), 1, None, 2);
    run.permit(110 * MS, id(2, 0), 2, None, 2);
    run.permit(150 * MS, id(3, 0), 3, None, 2);
    run.event(150 * MS, id(1, 0), Op::Release, Phase::Invoke);
    // A fourth granted when the second's deadline passes.
    run.permit(200 * MS, id(4, 0), 4, Some(300 * MS), 2);
    run.events
        .iter_mut()
        .filter(|e| e.hold() == id(2, 0) && e.phase == Phase::Ok)
        .for_each(|e| e.valid_until = Some(200 * MS));
    let report = check(&run.input());
    assert!(report.over_limit.is_empty(), "{report}");
    assert_eq!(report.peak_holders.get("n"), Some(&2));
}

#[test]
fn indeterminate_permits_are_never_counted() {
    // Two permits of two held; a third acquire timed out, a fourth died mid-acquire, a fifth
    // failed: none of them is a holder.
    let mut run = Run::new();
    run.permit(100 * MS, id(1, 0), 1, None, 2);
    run.permit(110 * MS, id(2, 0), 2, None, 2);
    for (worker, phase) in [(3, Some(Phase::Info)), (4, None), (5, Some(Phase::Fail))] {
        run.event(120 * MS, id(worker, 0), Op::Acquire, Phase::Invoke)
            .permits = Some(2);
        if let Some(phase) = phase {
            run.event(150 * MS, id(worker, 0), Op::Acquire, phase)
                .permits = Some(2);
        }
    }
    run.release(300 * MS, id(1, 0));
    run.release(300 * MS, id(2, 0));
    let report = check(&run.input());
    assert!(report.over_limit.is_empty(), "{report}");
    assert_eq!(report.holds.iter().filter(|h| !h.determinate).count(), 2);
    assert_eq!(report.peak_holders.get("n"), Some(&2));
}

#[test]
fn a_lock_granted_while_permits_are_held_is_over_the_limit() {
    // The contract refuses a lock on a name held as a semaphore: a lock among permits is one
    // holder too many, whatever the semaphore's limit.
    let mut run = Run::new();
    run.permit(100 * MS, id(1, 0), 1, None, 3);
    run.acquire(110 * MS, id(2, 0), 2, None);
    run.release(200 * MS, id(1, 0));
    run.release(210 * MS, id(2, 0));
    // Later, the name free, a lock alone and then permits are fine.
    run.acquire(300 * MS, id(3, 0), 3, None);
    run.release(350 * MS, id(3, 0));
    run.permit(400 * MS, id(4, 0), 4, None, 3);
    run.permit(410 * MS, id(5, 0), 5, None, 3);
    let report = check(&run.input());
    assert_eq!(report.over_limit.len(), 1, "{report}");
    assert_eq!(report.over_limit[0].limit, 1);
    let ids: Vec<HoldId> = report.over_limit[0].holds.iter().map(|h| h.id).collect();
    assert_eq!(ids, [id(1, 0), id(2, 0)]);
}

#[test]
fn a_semaphore_of_one_permit_is_checked_as_a_lock() {
    let mut run = Run::new();
    run.permit(100 * MS, id(1, 0), 1, None, 1);
    run.permit(150 * MS, id(2, 0), 2, None, 1);
    let report = check(&run.input());
    assert!(report.semaphores.is_empty(), "{report}");
    assert_eq!(report.overlaps.len(), 1, "{report}");
    assert!(report.over_limit.is_empty());
}

#[test]
fn a_lock_run_is_checked_as_before_beside_a_semaphore() {
    // The clean three-worker run of locks on "n", plus permits of another name: the lock's
    // report is what it is alone, register and all.
    let alone = check(&clean_run().input());
    let mut run = clean_run();
    let mut input = run.input();
    for k in 0..4u64 {
        let hold = id(10 + u32::try_from(k).unwrap(), 0);
        let t = (100 + 10 * k) * MS;
        input
            .events
            .push(Event::at(t - MS, RUN, hold, "s", Op::Acquire, Phase::Invoke).permits(Some(3)));
        input.events.push(
            Event::at(t, RUN, hold, "s", Op::Acquire, Phase::Ok)
                .token(100 + k)
                .permits(Some(3)),
        );
        let base = run.fenced.read("s").set;
        run.fenced.write("s", 100 + k, hold, base, 100 + k);
    }
    input.register = run.fenced.snapshot();
    let mixed = check(&input);
    assert_eq!(mixed.overlaps, alone.overlaps);
    assert_eq!(mixed.register, alone.register);
    assert_eq!(mixed.shadow, alone.shadow);
    assert_eq!(mixed.tokens, alone.tokens);
    assert_eq!(mixed.over_limit.len(), 1, "four permits of three: {mixed}");
    assert_eq!(mixed.semaphore_register.as_ref().unwrap().writes, 4);
    assert!(alone.semaphores.is_empty() && alone.semaphore_register.is_none());
}

#[test]
fn semaphore_tokens_rise_in_real_time_not_in_return_order() {
    // Two grants in flight at once may return in either order: 2 returns before 1.
    let mut run = Run::new();
    run.event(100 * MS, id(1, 0), Op::Acquire, Phase::Invoke)
        .permits = Some(3);
    run.event(101 * MS, id(2, 0), Op::Acquire, Phase::Invoke)
        .permits = Some(3);
    let ok = run.event(110 * MS, id(2, 0), Op::Acquire, Phase::Ok);
    ok.token = Some(2);
    ok.permits = Some(3);
    let ok = run.event(120 * MS, id(1, 0), Op::Acquire, Phase::Ok);
    ok.token = Some(1);
    ok.permits = Some(3);
    let report = check(&run.input());
    assert!(report.tokens.is_empty(), "{report}");

    // But an acquire invoked after a grant returned must get a higher token, and no two share
    // one.
    run.permit(200 * MS, id(3, 0), 1, None, 3);
    let report = check(&run.input());
    assert!(
        report.tokens.contains(&TokenIssue::Decreasing {
            name: "n".into(),
            earlier: (id(2, 0), 2),
            later: (id(3, 0), 1),
        }),
        "{report}"
    );
    assert!(
        report.tokens.contains(&TokenIssue::Duplicate {
            name: "n".into(),
            token: 1,
            holds: (id(1, 0), id(3, 0)),
        }),
        "{report}"
    );
    assert_eq!(report.tokens.len(), 2, "{report}");
}

#[test]
fn semaphore_registers_keep_their_integrity_checks() {
    // A permit writes with two tokens: one token is one permit, still.
    let mut run = Run::new();
    run.permit(100 * MS, id(1, 0), 1, None, 3);
    run.permit(110 * MS, id(2, 0), 2, None, 3);
    run.rmw(id(1, 0), 1, 1);
    run.rmw(id(1, 0), 7, 2);
    let report = check(&run.input());
    assert_eq!(
        report
            .semaphore_register
            .as_ref()
            .unwrap()
            .integrity_faults(),
        1,
        "{report}"
    );
    let unmet = Expect::CLEAN.check(&report).unwrap_err();
    assert_eq!(unmet, "register integrity faults: expected 0, found 1");
}

#[test]
fn a_spec_and_a_history_without_permits_read_as_a_lock() {
    let line = r#"{"run":"r","worker":1,"pid":7,"handle":0,"name":"n","op":"acquire","phase":"ok","t":5,"token":3}"#;
    let event: Event = serde_json::from_str(line).unwrap();
    assert_eq!(event.permits, None);
    assert!(!serde_json::to_string(&event).unwrap().contains("permits"));
    let with = serde_json::to_string(&event.clone().permits(Some(3))).unwrap();
    assert!(with.contains(r#""permits":3"#), "{with}");
}

/// Three readers held in a staircase, then a writer granted while the last reader still holds:
/// the readers meeting is no finding, the writer meeting a reader is, and the writer's write is
/// judged on the register as a lock's.
#[test]
fn readers_meet_freely_and_a_writer_meeting_one_is_reported() {
    let readers = |run: &mut Run| {
        for k in 0..3u64 {
            let hold = id(u32::try_from(k).unwrap() + 1, 0);
            run.acquire((100 + 10 * k) * MS, hold, k + 1, None);
            for event in run.events.iter_mut().rev().take(2) {
                event.shared = true;
            }
            run.release((200 + 10 * k) * MS, hold);
        }
    };
    let mut run = Run::new();
    readers(&mut run);
    let report = check(&run.input());
    assert!(
        report.over_limit.is_empty() && report.overlaps.is_empty(),
        "{report}"
    );
    assert_eq!(report.peak_holders.get("n"), Some(&3));
    assert!(
        report
            .to_string()
            .contains("n (readers and a writer, at most 3 held at once)"),
        "{report}"
    );

    let mut run = Run::new();
    readers(&mut run);
    let writer = id(9, 0);
    run.acquire(215 * MS, writer, 4, None);
    run.rmw(writer, 4, 4);
    run.release(300 * MS, writer);
    let report = check(&run.input());
    assert_eq!(report.over_limit.len(), 1, "{report}");
    assert_eq!(report.over_limit[0].limit, 1);
    assert_eq!(
        report.register.writes, 1,
        "a writer's write is a lock's: {report}"
    );
}
