//! Where an example keeps things: in memory, or on PostgreSQL and NATS JetStream when both
//! `SURELY_POSTGRES_URL` and `SURELY_NATS_URL` are set (or `--postgres URL --nats URL`).

/// Where to keep things: memory, or PostgreSQL and JetStream at these URLs.
pub(crate) enum Mode {
    Memory,
    Durable { postgres: String, nats: String },
}

/// The mode the environment and the arguments ask for; one URL without the other is an error.
pub(crate) fn mode() -> Result<Mode, Box<dyn std::error::Error + Send + Sync>> {
    let mut postgres = std::env::var("SURELY_POSTGRES_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let mut nats = std::env::var("SURELY_NATS_URL")
        .ok()
        .filter(|v| !v.is_empty());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--postgres" => postgres = Some(args.next().ok_or("--postgres needs a URL")?),
            "--nats" => nats = Some(args.next().ok_or("--nats needs a URL")?),
            other => {
                return Err(format!(
                    "unknown argument {other:?} (expected --postgres URL --nats URL)"
                )
                .into())
            }
        }
    }
    match (postgres, nats) {
        (None, None) => Ok(Mode::Memory),
        (Some(postgres), Some(nats)) => Ok(Mode::Durable { postgres, nats }),
        (Some(_), None) => Err(
            "SURELY_POSTGRES_URL is set but SURELY_NATS_URL is not: the durable mode needs both"
                .into(),
        ),
        (None, Some(_)) => Err(
            "SURELY_NATS_URL is set but SURELY_POSTGRES_URL is not: the durable mode needs both"
                .into(),
        ),
    }
}
