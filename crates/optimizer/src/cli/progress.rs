//! [`Progress`]: a one-line progress bar on stderr, drawn only when stderr is a terminal.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WIDTH: usize = 30;
const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// Progress of a batch of jobs.
pub struct Progress {
    label: &'static str,
    enabled: bool,
    last_draw: Mutex<Option<Instant>>,
}

impl Progress {
    /// A bar for `label`, enabled when stderr is a terminal.
    pub fn new(label: &'static str) -> Progress {
        Progress {
            label,
            enabled: std::io::stderr().is_terminal(),
            last_draw: Mutex::new(None),
        }
    }

    /// Redraws the bar (at most every 100 ms, and always at the end).
    pub fn update(&self, done: usize, total: usize) {
        if !self.enabled {
            return;
        }
        let mut last = self.last_draw.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if done < total && last.is_some_and(|t| now - t < REDRAW_EVERY) {
            return;
        }
        *last = Some(now);
        let line = render(self.label, done, total);
        let mut stderr = std::io::stderr().lock();
        // Progress output is best effort: a closed stderr must not fail the run.
        let _ = write!(stderr, "\r{line}{}", if done >= total { "\n" } else { "" });
        let _ = stderr.flush();
    }
}

/// `label [#####-----] done/total`.
fn render(label: &str, done: usize, total: usize) -> String {
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    format!(
        "{label} [{}{}] {done}/{total}",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled.min(WIDTH))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bar_fills_in_proportion() {
        let line = render("replay", 15, 60);
        assert_eq!(
            line,
            format!("replay [{}{}] 15/60", "#".repeat(7), "-".repeat(23))
        );
        assert!(render("x", 0, 0).contains(&"#".repeat(WIDTH)));
    }
}
