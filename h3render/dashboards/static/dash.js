// h3render dashboard: play clips on hover/click, submit the layout picker on change,
// and keep running jobs' progress live by polling the page's JSON (data-live on <body>).
(function () {
  "use strict";

  document.querySelectorAll("video.clip:not(.big)").forEach(function (v) {
    function play() { var p = v.play(); if (p && p.catch) { p.catch(function () {}); } }
    v.addEventListener("mouseenter", play);
    v.addEventListener("mouseleave", function () { v.pause(); });
    v.addEventListener("click", function () { if (v.paused) { play(); } else { v.pause(); } });
  });

  // Moving an axis to a side another axis holds swaps them when the old side would be left empty
  // (seed rows / steps columns -> seed columns / steps rows), then submits.
  var pickers = Array.prototype.slice.call(document.querySelectorAll("select.autosubmit"));
  pickers.forEach(function (s) {
    s.setAttribute("data-prev", s.value);
    s.addEventListener("change", function () {
      var from = s.getAttribute("data-prev"), to = s.value;
      var left = pickers.filter(function (o) { return o !== s && o.value === from; });
      var there = pickers.filter(function (o) { return o !== s && o.value === to; });
      if (from !== "pages" && left.length === 0 && there.length > 0) { there[there.length - 1].value = from; }
      s.form.submit();
    });
  });

  var body = document.body;
  if (!body.hasAttribute("data-live")) { return; }
  var url = body.getAttribute("data-live");
  if (!url) { // a page without a JSON view: refresh it while something runs
    setTimeout(function () { location.reload(); }, 5000);
    return;
  }

  function fmt(s) {
    if (s === null || s === undefined) { return ""; }
    return s < 60 ? s.toFixed(s < 10 ? 1 : 0) + " s" : Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
  }

  function update(job) {
    var nodes = document.querySelectorAll('[data-job-id="' + job.id + '"]');
    var reload = false;
    nodes.forEach(function (el) {
      var was = el.getAttribute("data-state");
      if (was && was !== job.state) { reload = true; }
      var bar = el.querySelector(".bar.live > span");
      if (bar && job.progress !== null) { bar.style.width = (job.progress * 100).toFixed(1) + "%"; }
      var text = el.querySelector(".live-text");
      if (text) {
        var t = job.step !== null ? "step " + job.step + " / " + job.steps : (job.phase || job.state);
        if (job.eta_s !== null) { t += " · ETA " + fmt(job.eta_s); }
        text.textContent = t;
      }
    });
    return reload;
  }

  // The sweep page's counts, from the summary every poll carries (the grid shows one window only).
  function showSummary(sum) {
    var counts = document.querySelector(".summary .sweep-counts");
    if (!counts || !sum || !sum.states) { return; }
    while (counts.firstChild) { counts.removeChild(counts.firstChild); }
    Object.keys(sum.states).sort().forEach(function (s) {
      var b = document.createElement("span");
      b.className = "badge s-" + s;
      b.textContent = sum.states[s] + " " + s;
      counts.appendChild(b);
      counts.appendChild(document.createTextNode(" "));
    });
    var done = document.querySelector(".summary .sweep-done");
    if (done) { done.textContent = sum.done + " / " + sum.jobs + " done"; }
    var bar = document.querySelector(".summary .sweep-progress .bar > span");
    if (bar && sum.jobs) { bar.style.width = (100 * sum.done / sum.jobs).toFixed(1) + "%"; }
  }

  // A sweep's JSON answers with next_since: the next poll asks only for what changed after it.
  function withSince(u, since) {
    var parsed = new URL(u, location.href);
    parsed.searchParams.set("since", String(since));
    return parsed.pathname + parsed.search;
  }

  function poll() {
    fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (doc) {
        if (!doc) { return; }
        var jobs = (doc.jobs || [doc]).concat(doc.live || []);
        var reload = false;
        jobs.forEach(function (j) { if (update(j)) { reload = true; } });
        var single = document.querySelector(".summary .progress[data-job-id]");
        if (!doc.jobs && single && ["finished", "failed", "canceled"].indexOf(doc.state) >= 0) { reload = true; }
        if (doc.summary) {
          showSummary(doc.summary);
          if (doc.summary.done >= doc.summary.jobs) { reload = true; }
        }
        if (doc.next_since !== undefined && doc.next_since !== null) { url = withSince(url, doc.next_since); }
        if (reload) { location.reload(); } else { setTimeout(poll, 1500); }
      })
      .catch(function () { setTimeout(poll, 5000); });
  }
  setTimeout(poll, 1500);
})();
