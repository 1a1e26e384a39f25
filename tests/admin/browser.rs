//! The admin's pages in a real headless Chromium, driven over WebDriver: an operator lists the
//! manual queue, opens an entry's evidence, settles it with why, and sees it leave the queue
//! and appear in the audit log.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them when missing): the
//! test starts `chromedriver` itself on a free loopback port, and **fails** (never skips) when
//! it cannot. It leaves a screenshot of the settled entry at
//! `target/test-artifacts/admin-settled.png` (and of the page it was on when it failed,
//! `admin-failed.png`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use axum::Router;
use fantoccini::{ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use surely::admin::{Admin, AuditLog, Authorize};
use surely::ledger::{EntryState, Ledger, MemoryLedger};

use super::http::{manual_entry, serve};

/// How long chromedriver has to answer, and the browser to start.
const START: Duration = Duration::from_secs(20);

fn artifacts() -> PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `chromedriver` on a free loopback port, killed when dropped.
async fn chromedriver() -> (tokio::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = tokio::process::Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start chromedriver ({e}): install Debian's chromium and chromium-driver \
                 (.ci/run does when they are missing)"
            )
        });
    // Its clock, not ours: a short real wait, bounded.
    let ready = tokio::time::timeout(START, async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "chromedriver did not listen on 127.0.0.1:{port} within {START:?}"
    );
    (child, format!("http://127.0.0.1:{port}"))
}

async fn browser(driver: &str) -> fantoccini::Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".to_owned(),
        serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,900"],
        }),
    );
    tokio::time::timeout(
        START,
        ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(driver),
    )
    .await
    .unwrap_or_else(|_| panic!("Chromium did not start within {START:?}"))
    .unwrap_or_else(|e| panic!("Chromium did not start through {driver}: {e}"))
}

#[tokio::test]
async fn an_operator_settles_an_entry_in_a_real_browser() {
    let ledger = MemoryLedger::new();
    let id = manual_entry(&ledger, "unk-browser-1", "o-41").await;
    manual_entry(
        &ledger,
        "unk-browser-2",
        "<script>document.title='owned'</script>",
    )
    .await;
    let audit = AuditLog::memory();
    let admin = Admin::builder()
        .ledger(ledger.clone())
        .audit(audit.clone())
        .authorize(Authorize::dev_allow_all_from_loopback())
        .build();
    let addr: SocketAddr = serve(Router::new().nest("/admin", admin.router())).await;

    let (mut driver, url) = chromedriver().await;
    let client = browser(&url).await;
    let run = settle_in(&client, addr).await;
    if run.is_err()
        && let Ok(png) = client.screenshot().await
    {
        let _ = std::fs::write(artifacts().join("admin-failed.png"), png);
    }
    let _ = client.close().await;
    let _ = driver.kill().await;
    run.unwrap();

    let entry = ledger.get(&id).await.unwrap().unwrap();
    assert_eq!(entry.state, EntryState::Settled);
    let line = &audit.list(1).await.unwrap()[0];
    assert_eq!(
        (line.who.as_str(), line.why.as_str()),
        ("dev@127.0.0.1", "found o-41 in the order table")
    );
}

async fn settle_in(
    client: &fantoccini::Client,
    addr: SocketAddr,
) -> Result<(), Box<dyn std::error::Error>> {
    let base = format!("http://{addr}/admin");
    client.goto(&base).await?;
    assert_eq!(
        client
            .find(Locator::Id("count-manual"))
            .await?
            .text()
            .await?,
        "2"
    );
    client
        .find(Locator::Id("nav-manual"))
        .await?
        .click()
        .await?;
    let rows = client.find(Locator::Id("entries")).await?.text().await?;
    assert!(
        rows.contains("unk-browser-1") && rows.contains("unk-browser-2"),
        "{rows}"
    );
    // The hostile key is text on the page, and ran nothing.
    assert!(
        rows.contains("<script>document.title='owned'</script>"),
        "{rows}"
    );
    assert_ne!(client.title().await?, "owned");

    client
        .find(Locator::LinkText("unk-browser-1"))
        .await?
        .click()
        .await?;
    let attempts = client.find(Locator::Id("attempts")).await?.text().await?;
    assert!(
        attempts.contains("req-a1"),
        "every attempt's evidence: {attempts}"
    );
    assert_eq!(
        client.find(Locator::Id("state")).await?.text().await?,
        "manual"
    );
    client
        .find(Locator::Id("verdict-succeeded"))
        .await?
        .click()
        .await?;
    client
        .find(Locator::Id("why"))
        .await?
        .send_keys("found o-41 in the order table")
        .await?;
    client
        .find(Locator::Id("settle-submit"))
        .await?
        .click()
        .await?;
    client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Id("settlement"))
        .await?;
    assert_eq!(
        client.find(Locator::Id("state")).await?.text().await?,
        "settled"
    );
    std::fs::write(
        artifacts().join("admin-settled.png"),
        client.screenshot().await?,
    )?;

    client
        .find(Locator::Id("nav-manual"))
        .await?
        .click()
        .await?;
    let rows = client.find(Locator::Id("entries")).await?.text().await?;
    assert!(!rows.contains("unk-browser-1"), "left the queue: {rows}");
    assert!(rows.contains("unk-browser-2"));
    client.goto(&format!("{base}/audit")).await?;
    let audit = client.find(Locator::Id("audit")).await?.text().await?;
    assert!(
        audit.contains("dev@127.0.0.1") && audit.contains("ledger.settle"),
        "{audit}"
    );
    Ok(())
}
