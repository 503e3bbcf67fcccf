//! Fault cases decided by the history checker: worker **processes** take locks and update a
//! fenced register while the harness pauses and kills them; afterwards the checker reads what
//! was recorded (see [`crate::history`]) and the case asserts its expectation profile. A failing
//! case names the directory where the whole run was dumped.
//!
//! The cases are grouped by what the harness does: to the worker processes (`workers`: paused,
//! killed), to the server process (`restarts`: restarted, crashed, frozen, killed), to the link
//! between them (`links`: cut, slowed, replies lost or held back), and to what the deployment
//! remembers (`amnesia`); `long` runs a mixed load through every client-side fault in turn, for
//! a time; `semaphores` runs worker, pause, kill and partition cases on semaphores' permits,
//! judged against their limit; `reader_writer` runs worker, pause and kill cases on readers and
//! writers of reader-writer locks, a writer judged alone; `elections` pauses, kills and cuts off
//! leaders of an election whose candidates campaign each round. What they share is in `steps`.

mod amnesia;
mod elections;
mod links;
mod long;
mod reader_writer;
mod restarts;
mod semaphores;
mod shared_names;
mod steps;
mod workers;

pub use amnesia::{mitigated_server_keeps_the_lock, server_that_forgets_a_lock_is_caught};
pub use elections::{
    election_leaders_paused_and_killed, election_partitioned_leader_is_fenced_off,
};
pub use links::{
    delayed_grant_counts_from_the_request, late_release_after_a_partition_spares_the_next_holder,
    lost_acquire_reply_leaves_nothing, lost_release_reply_spares_the_next_holder,
    partitioned_holder_is_fenced_off, slow_link_keeps_exclusion,
};
pub use long::{LongRun, long_run_under_every_nemesis};
pub use reader_writer::{
    reader_writer_workers_keep_writers_alone, reader_writer_workers_paused_and_killed,
};
pub(crate) use restarts::{acquire_riding_out, restart};
pub use restarts::{
    dead_or_frozen_server_answers_unavailable, frozen_server_holds_no_one_twice,
    server_restart_while_held_is_lost_or_kept, tokens_rise_across_server_restarts,
};
pub use semaphores::{
    semaphore_partitioned_holder_keeps_to_the_limit, semaphore_workers_keep_to_the_limit,
    semaphore_workers_paused_and_killed,
};
pub(crate) use steps::own_server;
pub(super) use steps::{announced, verify};
pub use workers::{
    coupon_100_requests_leave_zero, exclusion_is_history_checked,
    killed_at_random_points_leaves_nothing, killed_holder_process_frees_the_lock,
    paused_holder_is_fenced_off, paused_waiter_takes_no_stale_grant,
};
