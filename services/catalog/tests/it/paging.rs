//! Keyset pages over the scope's lists, every backend: each test below runs against SQLite and
//! against PostgreSQL (`PLINTH_TEST_POSTGRES_URL`; required under CI).

use std::collections::HashSet;

use plinth_catalog::Store;
use plinth_catalog::model::{
    Cursor, EnvironmentId, HarnessFields, MAX_PAGE_ITEMS, NewEnvironment, PageRequest,
};
use plinth_kit::ErrorCode;

use crate::scope;

backend_suite!(
    pages_walk_every_environment_once_in_order,
    pages_of_harnesses_follow_the_same_rules,
);

fn new(scope_name: &str, name: &str) -> NewEnvironment {
    NewEnvironment::new(
        scope(scope_name),
        name.to_owned(),
        String::new(),
        String::new(),
    )
    .expect("valid environment")
}

/// Creates come faster than the clock ticks, so many share a millisecond: the id breaks the
/// tie and no page repeats or drops one of them.
async fn pages_walk_every_environment_once_in_order(store: Store) {
    let mut created = Vec::new();
    for n in 0..57 {
        created.push(
            store
                .create_environment(new("acme", &format!("env {n}")))
                .await
                .expect("create")
                .id,
        );
    }
    store
        .create_environment(new("globex", "theirs"))
        .await
        .expect("create");
    let everything = store.list_environments(&scope("acme")).await.expect("list");
    let expected: Vec<EnvironmentId> = everything.iter().map(|e| e.id.clone()).collect();
    let mut seen = Vec::new();
    let mut page = PageRequest {
        limit: 10,
        after: None,
    };
    let mut pages = 0;
    loop {
        let answer = store
            .list_environments_page(&scope("acme"), &page)
            .await
            .expect("page");
        pages += 1;
        assert!(answer.items.len() <= 10);
        seen.extend(answer.items.iter().map(|e| e.id.clone()));
        match answer.next {
            Some(next) => {
                // What a client hands back is the opaque string, read again.
                let text = next.encode();
                page.after = Some(Cursor::decode(&text).expect("a cursor it gave"));
            }
            None => break,
        }
    }
    assert_eq!(pages, 6, "57 items in pages of 10");
    assert_eq!(seen, expected, "every environment once, in listing order");
    assert_eq!(
        seen.iter().collect::<HashSet<_>>(),
        created.iter().collect::<HashSet<_>>()
    );
    // A page exactly as long as what is left says so: no empty page follows.
    let last = store
        .list_environments_page(
            &scope("acme"),
            &PageRequest {
                limit: 57,
                after: None,
            },
        )
        .await
        .expect("page");
    assert_eq!(last.items.len(), 57);
    assert!(last.next.is_none());
    // A deleted environment's cursor still resumes just past where it stood.
    let cut = &expected[20];
    let cursor = {
        let environment = everything.iter().find(|e| &e.id == cut).expect("listed");
        Cursor {
            key: environment.created_at_ms,
            id: environment.id.as_str().to_owned(),
        }
    };
    store
        .delete_environment(&scope("acme"), cut)
        .await
        .expect("delete");
    let resumed = store
        .list_environments_page(
            &scope("acme"),
            &PageRequest {
                limit: 1,
                after: Some(cursor),
            },
        )
        .await
        .expect("page");
    assert_eq!(resumed.items[0].id, expected[21]);
    // Another scope's list is its own.
    let theirs = store
        .list_environments_page(&scope("globex"), &PageRequest::first())
        .await
        .expect("page");
    assert_eq!(theirs.items.len(), 1);
    assert!(theirs.next.is_none());
}

async fn pages_of_harnesses_follow_the_same_rules(store: Store) {
    let studio = store
        .create_environment(new("acme", "studio"))
        .await
        .expect("create");
    let other = store
        .create_environment(new("acme", "other"))
        .await
        .expect("create");
    for n in 0..7 {
        let environment = if n % 2 == 0 { &studio.id } else { &other.id };
        let fields = HarnessFields::new(
            scope("acme"),
            format!("harness {n}"),
            "codex".to_owned(),
            environment.as_str(),
        )
        .expect("valid harness");
        store.create_harness(fields).await.expect("create harness");
    }
    let expected: Vec<_> = store
        .list_harnesses(&scope("acme"))
        .await
        .expect("list")
        .into_iter()
        .map(|h| h.id)
        .collect();
    for (environment, total) in [(None, 7), (Some(&studio.id), 4)] {
        let mut seen = Vec::new();
        let mut page = PageRequest {
            limit: 3,
            after: None,
        };
        loop {
            let answer = store
                .list_harnesses_page(&scope("acme"), environment, &page)
                .await
                .expect("page");
            seen.extend(answer.items.into_iter().map(|h| h.id));
            match answer.next {
                Some(next) => page.after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen.len(), total);
        let in_order: Vec<_> = expected.iter().filter(|id| seen.contains(id)).collect();
        assert_eq!(seen.iter().collect::<Vec<_>>(), in_order);
    }
}

#[test]
fn a_page_request_is_checked_at_the_edge() {
    let first = PageRequest::new(0, "").expect("defaults");
    assert_eq!(first.limit, 100);
    assert!(first.after.is_none());
    assert_eq!(
        PageRequest::new(MAX_PAGE_ITEMS, "").expect("max").limit,
        MAX_PAGE_ITEMS
    );
    let error = PageRequest::new(MAX_PAGE_ITEMS + 1, "").expect_err("over the max");
    assert_eq!(error.code, ErrorCode::EnvironmentInvalid);
    assert!(error.message.starts_with("limit:"), "{}", error.message);
    for forged in ["nope", "!!!", "MTIz", "eDp5"] {
        let error = PageRequest::new(10, forged).expect_err(forged);
        assert_eq!(error.code, ErrorCode::EnvironmentInvalid);
        assert!(error.message.starts_with("after:"), "{}", error.message);
    }
}
