//! The case table: the single list both runners use.

pub mod cancel;
pub mod clock;
pub mod close;
pub mod crash;
pub mod election;
pub mod exclusion;
pub mod expiry;
pub mod faults;
pub mod fencing;
pub mod input;
pub mod inspect;
pub mod lost;
pub mod multi;
pub mod names;
pub mod ownership;
pub mod reader_writer;
pub mod recovery;
pub mod renewal;
pub mod runtime;
pub mod scale;
pub mod semaphore;
pub mod waiting;

use crate::case::{Case, Needs};
use crate::harness::Fault;

const NONE: Needs = Needs {
    extend: false,
    no_extend: false,
    ttl_lease: false,
    fencing: false,
    fault: None,
    child_process: false,
    workers: false,
    inspect: false,
    fifo: false,
    wake_on_release: false,
    lost_signal: false,
    takeover_signal: false,
    semaphore: false,
    one_limit_per_name: false,
    election: false,
    reader_writer: false,
};
const INSPECT: Needs = Needs {
    inspect: true,
    ..NONE
};
const FIFO: Needs = Needs {
    fifo: true,
    inspect: true,
    ..NONE
};
const WAKE_ON_RELEASE: Needs = Needs {
    wake_on_release: true,
    ..NONE
};
const TTL: Needs = Needs {
    ttl_lease: true,
    ..NONE
};
const EXTEND: Needs = Needs {
    extend: true,
    ttl_lease: true,
    ..NONE
};
const NO_EXTEND: Needs = Needs {
    no_extend: true,
    ..NONE
};
const FENCED: Needs = Needs {
    fencing: true,
    ..NONE
};
const FENCED_TTL: Needs = Needs {
    fencing: true,
    ttl_lease: true,
    ..NONE
};
const CHILD: Needs = Needs {
    child_process: true,
    ..NONE
};
const FENCED_CHILDREN: Needs = Needs {
    child_process: true,
    fencing: true,
    ..NONE
};
/// What the fault suite's worker cases need, and the long run.
pub(crate) const FENCED_WORKERS: Needs = Needs {
    workers: true,
    fencing: true,
    ..NONE
};
/// The worker cases on semaphores: workers, fencing and at least 3 permits.
const SEMAPHORE_WORKERS: Needs = Needs {
    semaphore: true,
    ..FENCED_WORKERS
};
const OWN_SERVER: Needs = Needs {
    fencing: true,
    fault: Some(Fault::OwnServer),
    ..NONE
};
const OWN_SERVER_NO_FENCE: Needs = Needs {
    fault: Some(Fault::OwnServer),
    ..NONE
};
const OWN_SERVER_CHILDREN: Needs = Needs {
    child_process: true,
    ..OWN_SERVER
};
const PROXY_CHILDREN: Needs = Needs {
    child_process: true,
    fencing: true,
    fault: Some(Fault::ProxyLink),
    ..NONE
};
const SEMAPHORE_PROXY_CHILDREN: Needs = Needs {
    semaphore: true,
    ..PROXY_CHILDREN
};
const AMNESIA_CHILDREN: Needs = Needs {
    child_process: true,
    fencing: true,
    fault: Some(Fault::Amnesia),
    ..NONE
};
const AMNESIA_MITIGATED_CHILDREN: Needs = Needs {
    fault: Some(Fault::AmnesiaMitigated),
    ..AMNESIA_CHILDREN
};
const KILL_HOLDER: Needs = Needs {
    fault: Some(Fault::KillHolder),
    ..NONE
};
const EXTEND_KILL_HOLDER: Needs = Needs {
    extend: true,
    ttl_lease: true,
    ..KILL_HOLDER
};
const EXTEND_KILL_HOLDER_LOST: Needs = Needs {
    lost_signal: true,
    ..EXTEND_KILL_HOLDER
};
const EXTEND_KILL_ONE_HOLD_LOST: Needs = Needs {
    fault: Some(Fault::KillOneHold),
    ..EXTEND_KILL_HOLDER_LOST
};
const KILL_HOLDER_LOST: Needs = Needs {
    lost_signal: true,
    ..KILL_HOLDER
};
const KILL_HOLDER_TAKEOVER: Needs = Needs {
    takeover_signal: true,
    ..KILL_HOLDER_LOST
};
const SESSION: Needs = Needs {
    fault: Some(Fault::SuspendSession),
    ..NONE
};
const SEMAPHORE: Needs = Needs {
    semaphore: true,
    ..NONE
};
const SEMAPHORE_ONE_LIMIT: Needs = Needs {
    one_limit_per_name: true,
    ..SEMAPHORE
};
const SEMAPHORE_FENCED: Needs = Needs {
    fencing: true,
    ..SEMAPHORE
};
const SEMAPHORE_TTL: Needs = Needs {
    ttl_lease: true,
    ..SEMAPHORE
};
const READER_WRITER_WORKERS: Needs = Needs {
    reader_writer: true,
    ..FENCED_WORKERS
};
const ELECTION_WORKERS: Needs = Needs {
    election: true,
    ..FENCED_WORKERS
};
const ELECTION_PROXY_CHILDREN: Needs = Needs {
    election: true,
    ..PROXY_CHILDREN
};
const ELECTION: Needs = Needs {
    election: true,
    ..NONE
};
const ELECTION_KILL_HOLDER: Needs = Needs {
    election: true,
    ..KILL_HOLDER
};
const ELECTION_SESSION: Needs = Needs {
    election: true,
    ..SESSION
};
const READER_WRITER: Needs = Needs {
    reader_writer: true,
    ..NONE
};
const READER_WRITER_QUEUE: Needs = Needs {
    reader_writer: true,
    inspect: true,
    ..NONE
};
const READER_WRITER_TTL: Needs = Needs {
    reader_writer: true,
    ttl_lease: true,
    ..NONE
};
const READER_WRITER_FENCED: Needs = Needs {
    reader_writer: true,
    fencing: true,
    ..NONE
};
const READER_WRITER_KILL_HOLDER: Needs = Needs {
    reader_writer: true,
    ..KILL_HOLDER
};
const KILL_WAITERS: Needs = Needs {
    fault: Some(Fault::KillWaiters),
    ..NONE
};

macro_rules! case {
    ($area:ident :: $case:ident, $needs:expr) => {
        Case {
            id: concat!(stringify!($area), "::", stringify!($case)),
            needs: $needs,
            run: |ctx| Box::pin($area::$case(ctx)),
        }
    };
}

static CASES: &[Case] = &[
    // First: the longest cases, so that the short ones run beside them, not after them. (A
    // fault that may reach other cases' clients runs alone: see the runner's `in_turn`.)
    case!(scale::thousand_waiters_are_all_served_in_turn, NONE),
    case!(scale::ten_thousand_held_locks_are_all_kept, NONE),
    case!(exclusion::coupon_100_tasks_leave_zero, NONE),
    case!(exclusion::purchase_10_registrations_create_one, NONE),
    case!(exclusion::same_client_is_not_reentrant, NONE),
    case!(exclusion::thousand_names_held_at_once, NONE),
    case!(waiting::try_acquire_on_held_returns_none, NONE),
    case!(waiting::acquire_times_out_within_bound, NONE),
    case!(waiting::release_wakes_waiter, NONE),
    case!(waiting::waiters_acquire_in_turn, NONE),
    case!(
        waiting::release_wakes_waiter_without_polling,
        WAKE_ON_RELEASE
    ),
    case!(waiting::waiters_acquire_in_arrival_order, FIFO),
    case!(waiting::waiter_survives_killed_connection, KILL_WAITERS),
    case!(ownership::stale_guard_cannot_release, TTL),
    case!(ownership::stale_guard_cannot_extend, TTL),
    case!(
        ownership::killed_holder_cannot_extend_the_next_holders_lock,
        EXTEND_KILL_HOLDER
    ),
    case!(ownership::release_frees_for_others, NONE),
    case!(expiry::forgotten_holder_frees_after_ttl, TTL),
    case!(expiry::dropped_guard_frees_promptly, NONE),
    case!(fencing::tokens_strictly_increase, FENCED),
    case!(fencing::stale_write_rejected_by_gate, FENCED_TTL),
    case!(renewal::keeps_lock_past_ttl_and_stops_at_release, EXTEND),
    case!(renewal::extend_moves_the_deadline, EXTEND),
    case!(
        renewal::one_lost_lock_in_a_batch_loses_only_its_guard,
        EXTEND_KILL_ONE_HOLD_LOST
    ),
    case!(renewal::extend_refused_where_unsupported, NO_EXTEND),
    case!(renewal::max_hold_time_releases, NONE),
    case!(lost::fires_when_lease_ends_without_renewal, TTL),
    case!(lost::fires_when_holder_killed, KILL_HOLDER_LOST),
    case!(
        lost::killed_holder_passes_the_lock_to_its_waiter,
        KILL_HOLDER
    ),
    case!(
        lost::killed_holder_learns_it_when_its_waiter_takes_over,
        KILL_HOLDER_TAKEOVER
    ),
    case!(lost::with_lock_stops_work_when_lost, TTL),
    case!(lost::with_lock_releases_after_work, NONE),
    case!(lost::suspended_guard_reports_it_and_resumes, SESSION),
    case!(
        lost::suspension_past_its_deadline_loses_every_guard,
        SESSION
    ),
    case!(lost::expired_session_loses_every_guard, SESSION),
    case!(
        recovery::waiter_rides_out_a_server_restart,
        OWN_SERVER_NO_FENCE
    ),
    case!(recovery::killed_session_client_acquires_again, KILL_HOLDER),
    case!(
        recovery::waiter_whose_session_is_killed_waits_on,
        KILL_HOLDER
    ),
    case!(crash::crashed_holder_process_frees_the_lock, CHILD),
    case!(faults::exclusion_is_history_checked, FENCED_WORKERS),
    case!(faults::coupon_100_requests_leave_zero, FENCED_WORKERS),
    case!(faults::paused_holder_is_fenced_off, FENCED_WORKERS),
    case!(faults::paused_waiter_takes_no_stale_grant, FENCED_WORKERS),
    case!(faults::killed_holder_process_frees_the_lock, FENCED_WORKERS),
    case!(
        faults::killed_at_random_points_leaves_nothing,
        FENCED_WORKERS
    ),
    case!(
        faults::semaphore_workers_keep_to_the_limit,
        SEMAPHORE_WORKERS
    ),
    case!(
        faults::semaphore_workers_paused_and_killed,
        SEMAPHORE_WORKERS
    ),
    case!(
        faults::reader_writer_workers_keep_writers_alone,
        READER_WRITER_WORKERS
    ),
    case!(
        faults::reader_writer_workers_paused_and_killed,
        READER_WRITER_WORKERS
    ),
    case!(faults::election_leaders_paused_and_killed, ELECTION_WORKERS),
    case!(faults::tokens_rise_across_server_restarts, OWN_SERVER),
    case!(
        faults::server_restart_while_held_is_lost_or_kept,
        OWN_SERVER
    ),
    case!(faults::partitioned_holder_is_fenced_off, PROXY_CHILDREN),
    case!(
        faults::election_partitioned_leader_is_fenced_off,
        ELECTION_PROXY_CHILDREN
    ),
    case!(
        faults::late_release_after_a_partition_spares_the_next_holder,
        PROXY_CHILDREN
    ),
    case!(faults::slow_link_keeps_exclusion, PROXY_CHILDREN),
    case!(faults::lost_acquire_reply_leaves_nothing, PROXY_CHILDREN),
    case!(
        faults::lost_release_reply_spares_the_next_holder,
        PROXY_CHILDREN
    ),
    case!(
        faults::semaphore_partitioned_holder_keeps_to_the_limit,
        SEMAPHORE_PROXY_CHILDREN
    ),
    case!(
        faults::frozen_server_holds_no_one_twice,
        OWN_SERVER_CHILDREN
    ),
    case!(
        faults::dead_or_frozen_server_answers_unavailable,
        OWN_SERVER_NO_FENCE
    ),
    case!(
        faults::delayed_grant_counts_from_the_request,
        PROXY_CHILDREN
    ),
    case!(
        faults::server_that_forgets_a_lock_is_caught,
        AMNESIA_CHILDREN
    ),
    case!(
        faults::mitigated_server_keeps_the_lock,
        AMNESIA_MITIGATED_CHILDREN
    ),
    case!(
        clock::client_wall_clock_steps_change_nothing,
        FENCED_CHILDREN
    ),
    case!(inspect::follows_a_hand_off, INSPECT),
    case!(cancel::dropped_acquire_leaves_nothing, NONE),
    case!(cancel::dropped_acquire_race_leaves_nothing, NONE),
    case!(cancel::storm_leaves_every_name_free, NONE),
    case!(cancel::aborted_release_leaves_client_usable, NONE),
    case!(cancel::settle_finishes_background_cleanup, NONE),
    case!(runtime::client_outlives_the_runtime_that_made_it, NONE),
    case!(runtime::client_shared_by_runtimes_running_at_once, NONE),
    case!(semaphore::try_beyond_the_limit_returns_none, SEMAPHORE),
    case!(semaphore::at_most_n_hold_at_once, SEMAPHORE),
    case!(semaphore::release_wakes_one_waiter, SEMAPHORE),
    case!(semaphore::forgotten_permit_comes_back, SEMAPHORE_TTL),
    case!(semaphore::stale_release_adds_nothing, SEMAPHORE_TTL),
    case!(semaphore::tokens_rise, SEMAPHORE_FENCED),
    case!(semaphore::bad_limits_refused, SEMAPHORE),
    case!(semaphore::cancel_storm_leaves_count_zero, SEMAPHORE),
    case!(election::one_leader_at_a_time, ELECTION),
    case!(election::leader_follows_proclaims, ELECTION),
    case!(election::resign_hands_over, ELECTION),
    case!(election::crashed_leader_hands_over, ELECTION_KILL_HOLDER),
    case!(
        election::with_leadership_stops_work_when_lost,
        ELECTION_KILL_HOLDER
    ),
    case!(election::dropped_campaign_leaves_nothing, ELECTION),
    case!(election::observe_sees_every_term, ELECTION),
    case!(
        election::observer_sees_a_crashed_leader_go,
        ELECTION_KILL_HOLDER
    ),
    case!(election::expired_candidate_never_leads, ELECTION_SESSION),
    case!(
        election::reconnected_leader_stays_the_only_one,
        ELECTION_SESSION
    ),
    case!(election::bad_values_refused, ELECTION),
    case!(
        reader_writer::readers_share_and_a_writer_excludes,
        READER_WRITER
    ),
    case!(reader_writer::writer_trumps_reader, READER_WRITER),
    case!(
        reader_writer::waiting_readers_enter_together,
        READER_WRITER_QUEUE
    ),
    case!(
        reader_writer::reader_stream_never_starves_a_writer,
        READER_WRITER
    ),
    case!(
        reader_writer::forgotten_reader_frees_its_share,
        READER_WRITER_TTL
    ),
    case!(
        reader_writer::killed_reader_frees_its_share,
        READER_WRITER_KILL_HOLDER
    ),
    case!(
        reader_writer::tokens_rise_across_modes,
        READER_WRITER_FENCED
    ),
    case!(reader_writer::cancel_storm_leaves_nothing, READER_WRITER),
    case!(reader_writer::refusals_hold_nothing, NONE),
    case!(
        inspect::counts_readers_and_waiting_modes,
        READER_WRITER_QUEUE
    ),
    case!(close::frees_every_name_at_once, NONE),
    case!(
        close::frozen_server_reports_what_it_could_not_release,
        OWN_SERVER_NO_FENCE
    ),
    case!(multi::opposite_orders_finish, NONE),
    case!(multi::one_wait_for_the_set, NONE),
    case!(multi::timeout_leaves_nothing_held, NONE),
    case!(multi::dropped_acquire_all_leaves_nothing, NONE),
    case!(multi::duplicates_taken_once_and_empty_refused, NONE),
    case!(multi::lost_member_loses_the_set, KILL_HOLDER),
    case!(multi::failed_member_release_frees_the_rest, KILL_HOLDER),
    case!(
        multi::refused_member_frees_the_taken_ones,
        SEMAPHORE_ONE_LIMIT
    ),
    case!(multi::members_taken_together_are_single_locks, FENCED),
    case!(names::unicode_names_work, NONE),
    case!(names::names_are_case_sensitive, NONE),
    case!(names::names_differ_after_byte_64, NONE),
    case!(names::names_with_slashes_work, NONE),
    case!(names::longest_name_works, NONE),
    case!(input::bad_names_rejected, NONE),
    case!(input::bad_options_rejected, NONE),
    case!(input::bad_extend_rejected, EXTEND),
    case!(input::any_options_behave, NONE),
    case!(input::any_names_behave, NONE),
];

/// Every conformance case, in report order.
pub fn cases() -> &'static [Case] {
    CASES
}
