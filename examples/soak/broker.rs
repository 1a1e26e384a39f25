//! The run's own NATS server (JetStream on), on a port of its own with its store in a
//! directory of the run's: restarting it takes no broker away from anything else on the
//! machine, and it goes with the driver whatever happens (killed on drop).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::BoxError;

/// How long the server may take to answer after its start.
const START_LIMIT: Duration = Duration::from_secs(15);
/// How long it may take to stop once told to.
const STOP_LIMIT: Duration = Duration::from_secs(5);

pub(crate) struct Broker {
    exe: PathBuf,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Broker {
    /// Starts `exe` on a free port of 127.0.0.1, its JetStream store under `dir`.
    pub(crate) async fn start(exe: &Path, dir: &Path) -> Result<Broker, BoxError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut broker = Broker {
            exe: exe.to_owned(),
            port,
            dir: dir.to_owned(),
            child: None,
        };
        broker.up().await?;
        Ok(broker)
    }

    pub(crate) fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    async fn up(&mut self) -> Result<(), BoxError> {
        std::fs::create_dir_all(&self.dir)?;
        let log = std::fs::File::create(self.dir.join("nats-server.log"))?;
        let child = Command::new(&self.exe)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.exe.display()))?;
        self.child = Some(child);
        let until = Instant::now() + START_LIMIT;
        loop {
            let answered = tokio::time::timeout(
                Duration::from_secs(2),
                surely::deps::async_nats::connect(self.url()),
            )
            .await;
            if let Ok(Ok(client)) = answered {
                if client.server_info().jetstream {
                    return Ok(());
                }
                return Err(format!("{} answers without JetStream", self.url()).into());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "the NATS server on {} did not answer within {}s (its log: {})",
                    self.url(),
                    START_LIMIT.as_secs(),
                    self.dir.join("nats-server.log").display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the server (SIGTERM, then SIGKILL past [`STOP_LIMIT`]).
    pub(crate) async fn down(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        if tokio::time::timeout(STOP_LIMIT, child.wait())
            .await
            .is_err()
        {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Stops it, waits `pause`, and starts it again on the same port and store.
    pub(crate) async fn restart(&mut self, pause: Duration) -> Result<(), BoxError> {
        self.down().await;
        tokio::time::sleep(pause).await;
        self.up().await
    }
}
