//! The output: markdown tables (with ours ÷ theirs ratios), then the raw samples' summary.

use std::fmt::Write;
use std::time::Duration;

use crate::host_functions::HostRate;
use crate::latency::{Method, Row};
use crate::stats::{list, median, quantile, sorted, summary};
use crate::throughput::Rate;

/// What the run found, printed at the end.
#[derive(Default)]
pub struct Report {
    tables: String,
    raw: String,
    notes: Vec<String>,
    pub skipped: Vec<String>,
    failures: Vec<String>,
}

fn hold_name(hold: Duration) -> String {
    if hold >= Duration::from_millis(1) {
        format!("{} ms", hold.as_secs_f64() * 1e3)
    } else {
        format!("{} µs", hold.as_micros())
    }
}

impl Report {
    pub fn note(&mut self, note: &str) {
        self.notes.push(note.into());
    }

    pub fn failed(&self) -> bool {
        !self.failures.is_empty()
    }

    /// The latency table: per hold, each method's p50 and p99 (µs, all samples pooled), its p50
    /// over cuda-async's (the same hold, parked or not alike), and CPU per wait.
    pub fn latency(&mut self, methods: &[Method], rows: &[Row]) {
        let t = &mut self.tables;
        let _ = writeln!(
            t,
            "## Wake latency: the host opens the held stream → the waker is woken\n"
        );
        let _ = writeln!(
            t,
            "Parked rows: → the parked `block_on` thread has the result. CPU per wait: the \
             library's own threads / the whole process but the measuring thread (includes the \
             driver's threads and the benchmark's helper threads: the floor's spinner, the \
             parked waiter), µs per wait and % of the hold.\n"
        );
        let _ = writeln!(
            t,
            "| hold | method | n | p50 µs | p99 µs | p50 ÷ cuda-async's | library threads' CPU per wait | all but the measuring thread |"
        );
        let _ = writeln!(t, "| --- | --- | --- | --- | --- | --- | --- | --- |");
        for row in rows {
            let method = &methods[row.method];
            let hold = hold_name(row.hold);
            if let Some(e) = &row.error {
                let _ = writeln!(t, "| {hold} | {} | failed: {e} | | | | | |", method.name);
                self.failures
                    .push(format!("{} at {hold}: {e}", method.name));
                if row.samples.is_empty() {
                    continue;
                }
            }
            let s = sorted(&row.samples);
            let p50 = quantile(&s, 0.5);
            let theirs = rows.iter().find(|r| {
                r.hold == row.hold
                    && methods[r.method].library == "cuda-async"
                    && methods[r.method].parked == method.parked
                    && r.error.is_none()
            });
            let ratio = match theirs {
                Some(r) if method.library != "cuda-async" => {
                    format!("{:.2}", p50 / quantile(&sorted(&r.samples), 0.5))
                }
                _ => "—".into(),
            };
            let waits = row.samples.len().max(1) as f64;
            let per_wait = |ns: u64| {
                let us = ns as f64 / 1000.0 / waits;
                format!(
                    "{us:.1} µs ({:.0} %)",
                    100.0 * us / (row.hold.as_secs_f64() * 1e6)
                )
            };
            let library = if method.threads.is_empty() {
                "—".into()
            } else {
                per_wait(row.cpu.library)
            };
            let _ = writeln!(
                t,
                "| {hold} | {} | {} | {:.1} | {:.1} | {ratio} | {library} | {} |",
                method.name,
                s.len(),
                p50,
                quantile(&s, 0.99),
                per_wait(row.cpu.others)
            );
            let _ = writeln!(
                self.raw,
                "- latency, {hold}, {}: {} µs; per-repetition p50: {}",
                method.name,
                summary(&row.samples),
                list(&row.rep_p50, 1)
            );
        }
        let _ = writeln!(t);
    }

    /// A throughput row: each side's items/s (median over repetitions), the first side over the
    /// second (median of the per-repetition ratios), CPU per item.
    pub fn throughput(
        &mut self,
        title: &str,
        names: &[String],
        results: Vec<Vec<Result<Rate, String>>>,
    ) {
        let t = &mut self.tables;
        let _ = writeln!(t, "## {title}\n");
        let _ = writeln!(
            t,
            "| side | items/s, median of repetitions | ÷ the second side | library threads' CPU per item | all but the measuring thread, per item |"
        );
        let _ = writeln!(t, "| --- | --- | --- | --- | --- |");
        let ok: Vec<Vec<Rate>> = results
            .iter()
            .map(|r| r.iter().filter_map(|x| x.as_ref().ok().cloned()).collect())
            .collect();
        for (i, name) in names.iter().enumerate() {
            if let Some(Err(e)) = results[i].iter().find(|r| r.is_err()) {
                let _ = writeln!(t, "| {name} | failed: {e} | | | |");
                self.failures.push(format!("{title}, {name}: {e}"));
                continue;
            }
            let rates: Vec<f64> = ok[i].iter().map(|r| r.per_second).collect();
            let ratio = if i == 0 && ok.len() > 1 && ok[1].len() == ok[0].len() {
                let ratios: Vec<f64> = ok[0]
                    .iter()
                    .zip(&ok[1])
                    .map(|(a, b)| a.per_second / b.per_second)
                    .collect();
                format!("{:.2}", median(&ratios))
            } else {
                "—".into()
            };
            let items: f64 = ok[i].iter().map(|r| r.items as f64).sum::<f64>().max(1.0);
            let library: u64 = ok[i].iter().map(|r| r.cpu.library).sum();
            let others: u64 = ok[i].iter().map(|r| r.cpu.others).sum();
            let _ = writeln!(
                t,
                "| {name} | {:.3} M | {ratio} | {:.0} ns | {:.0} ns |",
                median(&rates) / 1e6,
                library as f64 / items,
                others as f64 / items
            );
            let _ = writeln!(
                self.raw,
                "- {title}, {name}: M items/s per repetition: {}",
                list(&rates.iter().map(|r| r / 1e6).collect::<Vec<_>>(), 3)
            );
            for (rep, rate) in ok[i].iter().enumerate() {
                if let Some(c) = rate.enqueuers {
                    let per = |x: u64| x as f64 / rate.items.max(1) as f64;
                    let _ = writeln!(
                        self.raw,
                        "  - repetition {rep}: enqueuing threads per item: on a CPU {:.0} ns, \
                         waiting for one {:.0} ns; per 1,000 items {:.1} blocking and {:.1} \
                         preempted switches",
                        per(c.run_ns),
                        per(c.queued_ns),
                        per(c.voluntary) * 1e3,
                        per(c.involuntary) * 1e3
                    );
                }
                if let Some(waits) = &rate.waits {
                    let _ = writeln!(
                        self.raw,
                        "  - repetition {rep}: the enqueuing threads, sampled:"
                    );
                    let _ = write!(self.raw, "{}", waits.render(12));
                }
            }
        }
        let _ = writeln!(t);
    }

    /// The host-function table: items/s, × the raw floor (median of per-repetition ratios),
    /// enqueue ns.
    pub fn host(
        &mut self,
        n: usize,
        names: &[String],
        results: Vec<Vec<Result<HostRate, String>>>,
    ) {
        let t = &mut self.tables;
        let _ = writeln!(
            t,
            "## Host functions: {n} no-op host functions on one stream\n"
        );
        let _ = writeln!(
            t,
            "| method | items/s, median | × the raw floor (median of ratios) | enqueue ns, median | CPU per item, all but the measuring thread |"
        );
        let _ = writeln!(t, "| --- | --- | --- | --- | --- |");
        let ok: Vec<Vec<HostRate>> = results
            .iter()
            .map(|r| r.iter().filter_map(|x| x.as_ref().ok().cloned()).collect())
            .collect();
        for (i, name) in names.iter().enumerate() {
            if let Some(Err(e)) = results[i].iter().find(|r| r.is_err()) {
                let _ = writeln!(t, "| {name} | failed: {e} | | | |");
                self.failures.push(format!("host functions, {name}: {e}"));
                continue;
            }
            let rates: Vec<f64> = ok[i].iter().map(|r| r.per_second).collect();
            let ratio = if ok[0].len() == ok[i].len() {
                let ratios: Vec<f64> = ok[i]
                    .iter()
                    .zip(&ok[0])
                    .map(|(a, b)| a.per_second / b.per_second)
                    .collect();
                format!("{:.3}", median(&ratios))
            } else {
                "—".into()
            };
            let enqueue: Vec<f64> = ok[i].iter().map(|r| r.enqueue_ns).collect();
            let others: u64 = ok[i].iter().map(|r| r.cpu.others).sum();
            let _ = writeln!(
                t,
                "| {name} | {:.3} M | {ratio} | {:.0} | {:.0} ns |",
                median(&rates) / 1e6,
                median(&enqueue),
                others as f64 / (n * ok[i].len()).max(1) as f64
            );
            let _ = writeln!(
                self.raw,
                "- host functions, {name}: M items/s per repetition: {}; enqueue ns: {}",
                list(&rates.iter().map(|r| r / 1e6).collect::<Vec<_>>(), 3),
                list(&enqueue, 0)
            );
            for (rep, rate) in ok[i].iter().enumerate() {
                let busy: Vec<String> = rate
                    .busy
                    .iter()
                    .map(|(name, share)| format!("{name} {:.0} %", share * 100.0))
                    .collect();
                let _ = writeln!(
                    self.raw,
                    "  - repetition {rep}: busiest threads, CPU over wall: {}",
                    busy.join(", ")
                );
                if let Some(waits) = &rate.waits {
                    let _ = writeln!(self.raw, "  - repetition {rep}: every thread, sampled:");
                    let _ = write!(self.raw, "{}", waits.render(12));
                }
            }
        }
        let _ = writeln!(t);
    }

    pub fn print(&self) {
        print!("{}", self.tables);
        if !self.notes.is_empty() || !self.skipped.is_empty() || !self.failures.is_empty() {
            println!("## Notes\n");
            for s in &self.skipped {
                println!("- skipped: {s}");
            }
            for f in &self.failures {
                println!("- FAILED: {f}");
            }
            for n in &self.notes {
                println!("- {n}");
            }
            println!();
        }
        println!("## Raw samples' summary (µs unless stated)\n");
        print!("{}", self.raw);
    }
}
