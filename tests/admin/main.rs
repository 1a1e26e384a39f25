//! The operator's surface (`surely::admin`, feature `admin`): the audit log on memory and on
//! PostgreSQL, and the router over real HTTP on loopback.

#[allow(dead_code)]
#[path = "../support/mod.rs"]
mod support;

mod action;
mod audit;
mod browser;
#[cfg(feature = "cli")]
mod cli;
mod http;
#[cfg(feature = "review")]
mod review;
