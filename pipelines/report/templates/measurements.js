// Measurements of this run (timings: not lineage), drawn from window.ROSETTA_MEASUREMENTS, which
// ../../measurements/timings.js defines when it is there. Built with DOM calls, never innerHTML.
(function () {
  "use strict";
  var box = document.getElementById("measurements-body");
  if (!box) { return; }
  var runs = JSON.parse(box.getAttribute("data-runs"));  // [[model, framework], ...] in the report's order
  var all = window.ROSETTA_MEASUREMENTS;
  box.textContent = "";
  function add(parent, tag, text, cls) {
    var el = document.createElement(tag);
    if (text !== undefined && text !== null) { el.textContent = text; }
    if (cls) { el.className = cls; }
    parent.appendChild(el);
    return el;
  }
  function num(v) { return typeof v === "number" && isFinite(v); }
  function fixed(v, digits, suffix) { return num(v) ? v.toFixed(digits) + (suffix || "") : "\u2014"; }
  function grouped(v) {
    return num(v) ? Math.round(v).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",") : "\u2014";
  }
  // The resource probe's records (pipelines/resources.py, measurements/resources/): per process, its threads,
  // open descriptors and memory at the start, half way and the end of the probed window, and the verdict (flat when
  // the second half's peak adds at most the stated bound over the first half's).
  function resourceTable(parent, records) {
    var names = Object.keys(records || {}).sort();
    if (!names.length) { return null; }
    var t = add(parent, "table");
    t.className = "resources";
    var h = add(t, "tr");
    ["what", "process", "threads start / half way / end", "descriptors", "memory (MiB)", "window", "verdict"]
      .forEach(function (label, i) { add(h, "th", label, i < 2 || i === 6 ? "l" : ""); });
    names.forEach(function (name) {
      var rec = records[name];
      Object.keys(rec.processes || {}).forEach(function (proc) {
        var r = rec.processes[proc], tr = add(t, "tr");
        add(tr, "td", name, "l").title = rec.what || "";
        add(tr, "td", proc, "l");
        if (!r.resources) {
          add(tr, "td", "\u2014"); add(tr, "td", "\u2014"); add(tr, "td", "\u2014"); add(tr, "td", "\u2014");
          add(tr, "td", r.verdict || "\u2014", "l");
          return;
        }
        [["threads", 1], ["fds", 1], ["rss_bytes", 1048576]].forEach(function (pair) {
          var v = r.resources[pair[0]], k = pair[1];
          add(tr, "td", [v.start, v.half_way, v.end].map(function (x) { return grouped(x / k); }).join(" / "))
            .title = "peak " + grouped(v.peak / k) + "; second half added " + grouped(v.added / k) + " (bound " +
              grouped(r.bounds[pair[0]] / k) + ")";
        });
        add(tr, "td", fixed(r.seconds, 0, " s"));
        add(tr, "td", r.verdict, r.flat ? "l" : "l fail-text");
        if (!r.flat) { tr.className = "fail"; }
      });
    });
    return t;
  }
  if (!all || typeof all !== "object") {
    add(box, "p", "No measurements here: measurements/timings.js is absent. Timings are not part of the " +
      "lineage, so `dvc pull` does not bring them; running the train_export stages on this machine writes them " +
      "(measurements/, also shown by `dvc metrics show` and `dvc plots show`).", "absent");
    return;
  }
  var batches = [];
  runs.forEach(function (run) {
    var rec = all[run[0] + "/" + run[1]];
    ((rec && rec.latency && rec.latency.results) || []).forEach(function (r) {
      if (batches.indexOf(r.batch) < 0) { batches.push(r.batch); }
    });
  });
  batches.sort(function (a, b) { return a - b; });
  var table = add(box, "table");
  table.id = "measurements-table";
  var head = add(table, "tr");
  ["model", "framework", "train time", "steady samples/s"].forEach(function (label, i) {
    add(head, "th", label, i < 2 ? "l" : "");
  });
  batches.forEach(function (b) {
    add(head, "th", "batch " + b + ": native ms");
    add(head, "th", "batch " + b + ": ONNX Runtime ms");
    add(head, "th", "batch " + b + ": native / ORT");
  });
  var shown = 0;
  runs.forEach(function (run) {
    var rec = all[run[0] + "/" + run[1]];
    var tr = add(table, "tr");
    add(tr, "td", run[0], "l");
    add(tr, "td", run[1], "l");
    if (!rec) {
      var td = add(tr, "td", "not measured on this machine", "l note");
      td.colSpan = 2 + 3 * batches.length;
      return;
    }
    shown += 1;
    var train = rec.train || {};
    add(tr, "td", fixed(train.train_seconds, 2, " s"));
    add(tr, "td", grouped(train.steady_samples_per_second));
    var results = (rec.latency && rec.latency.results) || [];
    batches.forEach(function (b) {
      var r = results.filter(function (x) { return x.batch === b; })[0] || {};
      add(tr, "td", fixed(r.native_median_ms, 3));
      add(tr, "td", fixed(r.onnx_median_ms, 3));
      add(tr, "td", fixed(r.native_over_onnx, 2, "x"));
    });
  });
  // Where each stage's wall time went (measurements/stages/<stage>.json): start-up, then its phases.
  var stages = window.ROSETTA_STAGES || {};
  var names = Object.keys(stages).sort(function (a, b) {
    var order = ["data", "init", "train_export", "validate", "report"];
    var ka = order.indexOf(a.split("@")[0]), kb = order.indexOf(b.split("@")[0]);
    return ka !== kb ? ka - kb : (a < b ? -1 : (a > b ? 1 : 0));
  });
  if (names.length) {
    add(box, "h4", "Wall time per stage, start-up first (the last run of each stage on this machine)");
    var st = add(box, "table");
    st.id = "stages-table";
    var sh = add(st, "tr");
    ["stage", "runner", "interpreter", "imports", "framework import", "other phases", "total"].forEach(
      function (label, i) { add(sh, "th", label, i === 0 ? "l" : ""); });
    names.forEach(function (name) {
      var rec = stages[name] || {};
      var start = rec.startup || {};
      var phases = rec.phases || {};
      var framework = phases.framework_import;
      var rest = Object.keys(phases).filter(function (k) { return k !== "framework_import"; });
      var tr = add(st, "tr");
      add(tr, "td", name, "l");
      add(tr, "td", fixed(start.runner_seconds, 2, " s"));
      add(tr, "td", fixed(start.interpreter_seconds, 2, " s"));
      add(tr, "td", fixed(start.imports_seconds, 2, " s"));
      add(tr, "td", fixed(framework, 2, " s"));
      add(tr, "td", rest.map(function (k) { return k + " " + fixed(phases[k], 2, " s"); }).join(", "), "l");
      add(tr, "td", fixed(rec.total_seconds, 2, " s"));
    });
  }
  // Threads, descriptors and memory over time of every process the probe watched (data-parallel workers, servers).
  var probedAll = window.ROSETTA_RESOURCES;
  if (probedAll && Object.keys(probedAll).length) {
    add(box, "h4", "Threads, descriptors and memory over time (measurements/resources/, the last run of each)");
    resourceTable(box, probedAll).id = "resources-table";
    add(box, "p", "Each data-parallel worker samples itself every 0.2 s from its engine's start to its last " +
      "model; the servers are sampled while the load benchmark's client runs. Flat: the second half's peak adds " +
      "at most 4 threads, 4 descriptors and max(64 MiB, 10 %) of memory over the first half's; hover a cell for " +
      "its peak and what the second half added.", "note");
  }
  // Our train() beside each framework's idiomatic loop (benchmarks/train_throughput.py, measurements/throughput_table.json).
  var bench = window.ROSETTA_THROUGHPUT;
  add(box, "h4", "Training throughput: our train() against each framework's idiomatic loop " +
    "(benchmarks/train_throughput.py, its last run on this machine)");
  if (!bench || !bench.rows) {
    add(box, "p", "Not run on this machine: `.venv/bin/python benchmarks/train_throughput.py` measures it " +
      "(about ten minutes) and the table appears here.", "absent");
  } else {
    var bt = add(box, "table");
    bt.id = "throughput-table";
    var bh = add(bt, "tr");
    ["scale", "framework", "model", "samples / epoch", "epochs", "ours samples/s", "idiomatic samples/s",
     "ours / idiomatic", "per repeat", "verdict", "ours 1st epoch", "idiomatic 1st epoch"].forEach(
      function (label, i) { add(bh, "th", label, i < 3 ? "l" : ""); });
    bench.rows.forEach(function (r) {
      var tr = add(bt, "tr");
      add(tr, "td", r.scale, "l");
      add(tr, "td", r.framework, "l");
      add(tr, "td", r.model, "l");
      add(tr, "td", grouped(r.samples_per_epoch));
      add(tr, "td", grouped(r.epochs));
      add(tr, "td", grouped(r.ours_samples_per_second));
      add(tr, "td", grouped(r.idiomatic_samples_per_second));
      add(tr, "td", fixed(r.ratio, 2, "x"));
      add(tr, "td", fixed(r.ratio_range[0], 2) + "\u2013" + fixed(r.ratio_range[1], 2));
      add(tr, "td", r.verdict, "l").title = r.why;
      add(tr, "td", fixed(r.ours_first_epoch_seconds, 2, " s"));
      add(tr, "td", fixed(r.idiomatic_first_epoch_seconds, 2, " s"));
    });
    var set = bench.settings || {};
    add(box, "p", "Steady samples/s: samples per epoch over the median epoch time, the first epoch (compilation) " +
      "left out; " + (set.repeats || "?") + " repeats of each loop, alternating, each of the case's epochs " +
      "(more where the steady epochs would be short). Above 1, ours is faster. Verdicts: ok (at least 1.0), " +
      "noise (below, but ours was at least as fast in one repeat), parity cost (below in every repeat; hover " +
      "for what parity makes ours do).", "note");
  }
  var first = null;
  runs.forEach(function (run) { first = first || all[run[0] + "/" + run[1]]; });
  var env = (first && first.latency && first.latency.environment) || {};
  add(box, "p", shown + " of " + runs.length + " runs measured" +
    (env.machine ? " on " + env.machine + (num(env.available_cores) ? ", " + env.available_cores + " cores" : "") : "") +
    (env.python ? ", Python " + env.python : "") + ". Latency: medians after warm-up, interleaved repeats; above 1, " +
    "ONNX Runtime is faster. These figures are the last train_export run's on this machine: they may predate " +
    "the artifacts above (after `dvc pull`, or a run elsewhere).", "note");
  // Each export format as a deployment target (benchmarks/deployment.py, measurements/deployment.json), in the
  // Deployment section under its facts table (#deployment-measured, drawn once the page is parsed).
  document.addEventListener("DOMContentLoaded", function () {
    var where = document.getElementById("deployment-measured");
    if (!where) { return; }
    var dep = window.ROSETTA_DEPLOYMENT;
    where.textContent = "";
    add(where, "h4", "Measured on this machine (benchmarks/deployment.py, its last run)");
    if (!dep || !dep.rows) {
      add(where, "p", "Not run on this machine: `.venv/bin/python -m benchmarks.deployment` measures it (about " +
        "five to fifteen minutes for the cnn on 2 cores) and the table appears here.", "absent");
      return;
    }
    function size(n) {
      if (!num(n)) { return "\u2014"; }
      var units = [["GiB", 1073741824], ["MiB", 1048576], ["KiB", 1024]];
      for (var i = 0; i < units.length; i++) {
        if (n >= units[i][1]) { return (n / units[i][1]).toFixed(1) + " " + units[i][0]; }
      }
      return n + " B";
    }
    var envs = dep.environments || {};
    var dt = add(where, "table");
    dt.id = "deployment-table";
    var dh = add(dt, "tr");
    ["model", "format", "export of", "size", "interpreter", "imports", "load", "1st request", "cold start",
     "1st batch 64", "batch 1 median / p90", "batch 64 median / p90", "peak RSS", "environment", "runtime wheels",
     "model code"].forEach(function (label, i) { add(dh, "th", label, i < 3 ? "l" : ""); });
    dep.rows.forEach(function (r) {
      var tr = add(dt, "tr");
      var cold = r.cold || {};
      var steady = r.steady || {};
      var s1 = steady["1"] || {}, s64 = steady["64"] || {};
      var env = envs[r.env] || {};
      add(tr, "td", r.model, "l");
      add(tr, "td", r.format, "l");
      add(tr, "td", r.framework, "l");
      add(tr, "td", size(r.bytes));
      add(tr, "td", fixed(cold.interpreter_seconds, 2, " s"));
      add(tr, "td", fixed(cold.imports_seconds, 2, " s"));
      add(tr, "td", fixed(cold.load_seconds, 2, " s"));
      add(tr, "td", num(cold.first_request_seconds) ? (1e3 * cold.first_request_seconds).toFixed(1) + " ms" : "\u2014");
      add(tr, "td", fixed(cold.total_seconds, 2, " s"));
      add(tr, "td", fixed(r.first_batch64_ms, 1, " ms"));
      add(tr, "td", fixed(s1.median_ms, 3) + " / " + fixed(s1.p90_ms, 3, " ms"));
      add(tr, "td", fixed(s64.median_ms, 3) + " / " + fixed(s64.p90_ms, 3, " ms"));
      add(tr, "td", num(r.max_rss_mib) ? size(r.max_rss_mib * 1048576) : "\u2014");
      add(tr, "td", r.env + " " + size(env.bytes), "l");
      add(tr, "td", size(env.runtime_bytes));
      add(tr, "td", r.needs_model_code ? "yes" : "no");
    });
    var set = dep.settings || {};
    add(where, "p", "Medians over " + (set.repeats || "?") + " fresh processes per row, the rows interleaved and " +
      "rotated every repeat; steady latency over " + (set.calls || "?") + " calls per batch size after the first, " +
      "threads " + (set.threads || "?") + ". Cold start: from the spawn of a process of the format's environment " +
      "to its first answer at batch 1 (interpreter start-up, the imports the format needs, loading the file, the " +
      "first request); the OS file cache is warm. Environment: its folder on disk (every package Rosetta installs " +
      "there, kserve included); runtime wheels: the runtime's own (torch; tensorflow and keras; jax and jaxlib; " +
      "onnxruntime).", "note");
  });
  // The model servers under load (benchmarks/serving_load.py, measurements/serving_load.json), in the Serving
  // section (#serving-load, which comes before this script in the page; drawn once the page is parsed, as above).
  document.addEventListener("DOMContentLoaded", function () {
    var where = document.getElementById("serving-load");
    if (!where) { return; }
    var load = window.ROSETTA_SERVING_LOAD;
    where.textContent = "";
    add(where, "h4", "Under load, measured on this machine (benchmarks/serving_load.py, its last run; not lineage)");
    if (!load || !load.rows) {
      add(where, "p", "Not run on this machine: `.venv/bin/python benchmarks/serving_load.py` measures it (about " +
        "ten minutes on 2 cores) and the table appears here.", "absent");
      return;
    }
    var lt = add(where, "table");
    lt.id = "serving-load-table";
    var lh = add(lt, "tr");
    ["model", "protocol", "batch", "C", "server", "requests/s", "samples/s", "p50", "p99", "in-process p50",
     "p50 / in-process", "p50 \u2212 in-process", "errors", "server cores", "client cores"].forEach(
      function (label, i) { add(lh, "th", label, i < 2 || i === 4 ? "l" : ""); });
    load.rows.forEach(function (r) {
      var tr = add(lt, "tr");
      if (r.errors) { tr.className = "fail"; }
      add(tr, "td", r.model, "l");
      add(tr, "td", r.protocol, "l");
      add(tr, "td", grouped(r.batch));
      add(tr, "td", grouped(r.concurrency));
      add(tr, "td", r.server, "l");
      add(tr, "td", grouped(r.requests_per_second));
      add(tr, "td", grouped(r.samples_per_second));
      add(tr, "td", fixed(r.p50_ms, 2, " ms"));
      add(tr, "td", fixed(r.p99_ms, 2, " ms"));
      add(tr, "td", fixed(r.in_process_p50_ms, 3, " ms"));
      add(tr, "td", fixed(r.overhead_ratio, 1, "x"));
      add(tr, "td", fixed(r.overhead_ms, 2, " ms"));
      add(tr, "td", grouped(r.errors), r.errors ? "fail-text" : "").title = (r.error_examples || []).join("\n");
      add(tr, "td", fixed(r.server_cpu_cores, 2));
      add(tr, "td", fixed(r.client_cpu_cores, 2));
    });
    // p50 (solid) and p99 (dashed) against concurrency, one line per server, one small chart per protocol and
    // batch: inline SVG built with DOM calls (the page's CSP allows no image but data: URIs, and no library).
    var NS = "http://www.w3.org/2000/svg";
    function svg(parent, tag, attrs, text) {
      var el = document.createElementNS(NS, tag);
      Object.keys(attrs).forEach(function (k) { el.setAttribute(k, attrs[k]); });
      if (text !== undefined) { el.textContent = text; }
      parent.appendChild(el);
      return el;
    }
    var colors = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bc4c00", "#57606a"];
    var servers = [], panels = [], levels = [];
    load.rows.forEach(function (r) {
      if (servers.indexOf(r.server) < 0) { servers.push(r.server); }
      if (levels.indexOf(r.concurrency) < 0) { levels.push(r.concurrency); }
      var key = r.model + " " + r.protocol + ", batch " + r.batch;
      if (panels.indexOf(key) < 0) { panels.push(key); }
    });
    levels.sort(function (a, b) { return a - b; });
    var figs = add(where, "div", null, "figs");
    panels.forEach(function (key) {
      var rows = load.rows.filter(function (r) { return r.model + " " + r.protocol + ", batch " + r.batch === key; });
      var top = Math.max.apply(null, rows.map(function (r) { return num(r.p99_ms) ? r.p99_ms : 0; })) || 1;
      var W = 300, H = 190, L = 44, R = 8, T = 20, B = 30;
      var chart = svg(figs, "svg", {width: W, height: H, role: "img", "aria-label": "latency against concurrency, " + key});
      svg(chart, "rect", {x: 0, y: 0, width: W, height: H, fill: "#fff", stroke: "#d0d7de"});
      svg(chart, "text", {x: W / 2, y: 14, "text-anchor": "middle", "font-size": 12}, key);
      function x(c) { return L + (levels.length > 1 ? levels.indexOf(c) / (levels.length - 1) : 0.5) * (W - L - R); }
      function y(ms) { return H - B - (ms / top) * (H - T - B); }
      svg(chart, "line", {x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#57606a"});
      svg(chart, "line", {x1: L, y1: T, x2: L, y2: H - B, stroke: "#57606a"});
      [0, top / 2, top].forEach(function (ms) {
        svg(chart, "text", {x: L - 4, y: y(ms) + 4, "text-anchor": "end", "font-size": 10}, ms.toFixed(ms < 10 ? 1 : 0));
      });
      svg(chart, "text", {x: 4, y: T - 6, "font-size": 10}, "ms");
      levels.forEach(function (c) {
        svg(chart, "text", {x: x(c), y: H - B + 14, "text-anchor": "middle", "font-size": 10}, "C=" + c);
      });
      servers.forEach(function (server, i) {
        var mine = rows.filter(function (r) { return r.server === server; })
          .sort(function (a, b) { return a.concurrency - b.concurrency; });
        ["p50_ms", "p99_ms"].forEach(function (field) {
          var points = mine.filter(function (r) { return num(r[field]); })
            .map(function (r) { return x(r.concurrency).toFixed(1) + "," + y(r[field]).toFixed(1); });
          if (!points.length) { return; }
          svg(chart, "polyline", {points: points.join(" "), fill: "none", stroke: colors[i % colors.length],
            "stroke-width": 1.5, "stroke-dasharray": field === "p99_ms" ? "4 3" : "none"});
        });
        svg(chart, "text", {x: L + 6 + i * 60, y: H - 4, "font-size": 10, fill: colors[i % colors.length]}, server);
      });
    });
    var set = load.settings || {};
    var machine = load.machine || {};
    var avg = machine.load_average || {};
    add(where, "p", "Closed loop: C workers, each with its own keep-alive connection, each sending its next " +
      "request as soon as its previous answer came; " + (set.bounds || "") + "; the servers take turns within each " +
      "round, in an order rotated every round. Latency: " + (set.latency || "client side") + "; p50 solid, p99 " +
      "dashed in the charts. Every answer checked (status, one output logits of shape [n, classes]); a failed " +
      "request is an error (hover for its message). In process: the same export, loaded by the server's own model " +
      "class, its forward timed in that server's environment; threads per runtime " + (set.threads || "?") + ". " +
      (load.shares || "") + (machine.model ? " CPU: " + machine.model + "." : "") +
      (avg.before ? " Load average before / after: " + avg.before.map(function (v) { return v.toFixed(2); })
        .join(" ") + " / " + (avg.after || []).map(function (v) { return v.toFixed(2); }).join(" ") + "." : ""),
      "note");
    var probed = (window.ROSETTA_RESOURCES || {}).serving_load;
    if (probed) {
      add(where, "h4", "Each server's threads, descriptors and memory under that load");
      resourceTable(where, {serving_load: probed}).id = "serving-resources-table";
      add(where, "p", "Sampled every 0.2 s while the client ran, its rounds one after the other (" +
        (set.bad_every ? "every " + set.bad_every + "th request of a worker a bad one, refused" : "no bad requests") +
        "). Flat: the second half's peak adds at most 4 threads, 4 descriptors and max(64 MiB, 10 %) of memory " +
        "over the first half's (pipelines/resources.py).", "note");
    }
  });
  // The CPU the stages last ran on (measurements/cpu.json), in the environment section: its instruction sets pick
  // the kernels of oneDNN, MKL, XLA, OpenBLAS and ONNX Runtime (README, "The same bytes on any CPU with AVX2").
  // The environment section comes after this script in the page: drawn once the page is parsed.
  document.addEventListener("DOMContentLoaded", function () {
    var cpu = window.ROSETTA_CPU;
    var where = document.getElementById("environment-cpu");
    if (!cpu || !where) { return; }
    where.textContent = "";
    add(where, "p", "CPU of the last stage run on this machine (measurements/cpu.json, not lineage): " + cpu.model +
      ", " + cpu.logical_cores + " logical cores, " + cpu.machine + "; instruction sets: " +
      ((cpu.isa || []).join(" ") || "none read") + ". The stages cap oneDNN, MKL, XLA and OpenBLAS at AVX2.", "note");
  });
})();
