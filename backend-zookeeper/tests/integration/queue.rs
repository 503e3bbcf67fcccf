//! The queue under a name's node when that node is not dlock's own: an operator made it with an
//! ACL that lets clients create and delete children but not write the node's data. dlock's
//! one-round-trip acquire writes that data to count the queue; refused, it creates its node
//! alone and lists the queue, and the lock behaves as on any other name.

use crate::common;

use std::time::Duration;

use dlock_api::{DistributedLock, LockName, LockOptions};
use dlock_conformance::wait_for;
use dlock_zookeeper::{ZkConfig, ZkLock};
use zookeeper_client::{Acl, Acls, AuthId, CreateMode, Permission};

const BOUND: Duration = Duration::from_secs(45);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_node_without_write_permission_still_queues_and_hands_over() {
    let zk = dlock_test_servers::shared_zookeeper();
    let hosts = zk.connect_string();
    let config = ZkConfig::from_url(&zk.url()).unwrap();
    let name = LockName::new(format!("dlock-queue/{}/no-write", std::process::id())).unwrap();
    let parent = config.name_path(&name);

    let admin = common::raw_client(&hosts).await.unwrap();
    let open = CreateMode::Persistent.with_acls(Acls::anyone_all());
    let (prefix, _) = parent.rsplit_once('/').unwrap();
    admin.mkdir(prefix, &open).await.unwrap();
    let no_write = [Acl::new(
        Permission::READ | Permission::CREATE | Permission::DELETE,
        AuthId::anyone(),
    )];
    let restricted = CreateMode::Persistent.with_acls(Acls::new(&no_write));
    admin.create(&parent, &[], &restricted).await.unwrap();
    assert!(
        admin.set_data(&parent, b"x", None).await.is_err(),
        "the name's node must refuse writes for this test to mean anything"
    );

    let (a, b) = (
        ZkLock::connect_url(&zk.url()).await.unwrap(),
        ZkLock::connect_url(&zk.url()).await.unwrap(),
    );
    let first = a.try_acquire(&name, &LockOptions::new()).await.unwrap();
    let first = first.expect("a free name is granted");
    let waiter = wait_for::queued_waiter(BOUND, &b, &name).await;
    wait_for::within(BOUND, "the waiter to queue", async {
        while admin.list_children(&parent).await.map_or(0, |c| c.len()) < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    wait_for::hands_over(BOUND, first, waiter).await;
    admin.delete(&parent, None).await.unwrap();
}
