//! Operations and the time they took, by the wall clock and by the thread's own CPU time.

use std::fs;
use std::time::{Duration, Instant};

/// Operations done in the timed section, and how long it took.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// Operations, in the workload's unit (transactions, rows, bytes...).
    pub ops: f64,
    /// Wall-clock time of the timed section only.
    pub elapsed: Duration,
    /// Time the measuring thread spent on a CPU during it (user and kernel, not waiting for a
    /// CPU or a disk); `None` where `/proc/thread-self/schedstat` is missing.
    pub cpu: Option<Duration>,
}

impl Timed {
    /// Operations per second of wall-clock time.
    pub fn rate(&self) -> f64 {
        self.ops / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Both sections together.
    pub fn plus(self, other: Timed) -> Timed {
        Timed {
            ops: self.ops + other.ops,
            elapsed: self.elapsed + other.elapsed,
            cpu: self.cpu.zip(other.cpu).map(|(a, b)| a + b),
        }
    }

    /// Nothing yet.
    pub fn zero() -> Timed {
        Timed {
            ops: 0.0,
            elapsed: Duration::ZERO,
            cpu: Some(Duration::ZERO),
        }
    }

    /// Operations per second of CPU time; NaN when unknown.
    pub fn cpu_rate(&self) -> f64 {
        self.cpu
            .map_or(f64::NAN, |cpu| self.ops / cpu.as_secs_f64().max(1e-9))
    }
}

/// Times a section by the wall clock and by the thread's own CPU time.
pub struct Stopwatch {
    wall: Instant,
    cpu: Option<u64>,
}

impl Stopwatch {
    /// Starts both clocks.
    pub fn start() -> Stopwatch {
        let cpu = thread_cpu_ns();
        Stopwatch {
            wall: Instant::now(),
            cpu,
        }
    }

    /// Stops both clocks; `ops` operations were done.
    pub fn stop(&self, ops: f64) -> Timed {
        let elapsed = self.wall.elapsed();
        let cpu = match (self.cpu, thread_cpu_ns()) {
            (Some(start), Some(end)) => Some(Duration::from_nanos(end.saturating_sub(start))),
            _ => None,
        };
        Timed { ops, elapsed, cpu }
    }
}

/// Nanoseconds this thread has spent on a CPU, from the scheduler's own accounting. The kernel
/// brings a running task's count up to date only at scheduler events, so yield first: that is
/// one, and it makes the figure exact to the call.
pub fn thread_cpu_ns() -> Option<u64> {
    std::thread::yield_now();
    let stat = fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}
