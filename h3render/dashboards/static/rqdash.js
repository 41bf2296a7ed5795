// rq-dashboard's pages under /rq (templates/rq_dashboard/), drawn from its JSON. Every value
// read from Redis (queue, worker and host names, versions, descriptions, metadata, tracebacks)
// goes into the page as text (textContent, setAttribute): never parsed as HTML. Nothing here
// needs eval or an inline script, and links take only paths on this server.
// POST buttons are forms carrying their own CSRF token (the one for their URL only).
(function () {
  "use strict";

  var body = document.body;
  var page = body.getAttribute("data-rq-page");
  var prefix = body.getAttribute("data-rq-prefix") || "/rq/";
  var instance = body.getAttribute("data-rq-instance") || "0";
  var pollMs = parseInt(body.getAttribute("data-poll-ms"), 10) || 2500;
  var autorefresh = document.getElementById("autorefresh-switch");
  var enc = encodeURIComponent;

  // -------------------------------------------------------------- DOM from data, as text

  function isLocal(url) {
    return typeof url === "string" && url.charAt(0) === "/" && url.charAt(1) !== "/" && url.charAt(1) !== "\\";
  }

  function text(v) {
    return v === null || v === undefined ? "" : String(v);
  }

  // el("td", {class: "x", title: t}, [child, "text", ...]): attributes by setAttribute, strings as text nodes
  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (attrs[k] !== null && attrs[k] !== undefined) { node.setAttribute(k, text(attrs[k])); }
    });
    (children || []).forEach(function (c) {
      node.appendChild(typeof c === "object" && c !== null ? c : document.createTextNode(text(c)));
    });
    return node;
  }

  function link(href, label, attrs) {
    var a = el("a", attrs, [label]);
    if (isLocal(href)) { a.setAttribute("href", href); }
    return a;
  }

  function setRows(tbody, rows) {
    tbody.replaceChildren.apply(tbody, rows);
  }

  function emptyRow(cols, label) {
    return el("tr", {}, [el("td", {colspan: cols}, [label])]);
  }

  // -------------------------------------------------------------- URLs, JSON, times

  var url = {
    queuesData: function () { return prefix + instance + "/data/queues.json"; },
    queuesView: function () { return prefix + instance + "/view/queues"; },
    workersData: function () { return prefix + instance + "/data/workers.json"; },
    jobData: function (id) { return prefix + instance + "/data/job/" + enc(id) + ".json"; },
    jobView: function (id) { return prefix + instance + "/view/job/" + enc(id); },
    jobsData: function (q, reg, per, order, pg) {
      return prefix + instance + "/data/jobs/" + [q, reg, per, order, pg].map(enc).join("/") + ".json";
    },
    jobsView: function (q, reg, per, order, pg) {
      return prefix + instance + "/view/jobs/" + [q, reg, per, order, pg].map(enc).join("/");
    }
  };

  function getJSON(u) {
    return fetch(u, {credentials: "same-origin", headers: {"Accept": "application/json"}})
      .then(function (r) { return r.ok ? r.json() : Promise.reject(new Error("HTTP " + r.status)); });
  }

  function parseDate(iso) {
    if (!iso) { return null; }
    // Python's isoformat has microseconds: keep milliseconds, which every Date parser accepts
    var d = new Date(String(iso).replace(/(\.\d{3})\d+/, "$1"));
    return isNaN(d.getTime()) ? null : d;
  }

  function relative(iso) {
    var d = parseDate(iso);
    if (!d) { return iso ? text(iso) : "-"; }
    var s = Math.round((Date.now() - d.getTime()) / 1000), a = Math.abs(s), n, unit;
    if (a < 5) { return "just now"; }
    if (a < 90) { n = a; unit = "second"; } else if (a < 5400) { n = Math.round(a / 60); unit = "minute"; }
    else if (a < 129600) { n = Math.round(a / 3600); unit = "hour"; } else { n = Math.round(a / 86400); unit = "day"; }
    var span = n + " " + unit + (n === 1 ? "" : "s");
    return s >= 0 ? span + " ago" : "in " + span;
  }

  function relativeAndShort(iso) {
    var d = parseDate(iso);
    return d ? relative(iso) + " / " + d.toLocaleString() : "-";
  }

  // Redraw every poll interval while autorefresh is on; one failed fetch does not stop it.
  function every(draw) {
    function tick() {
      var on = !autorefresh || autorefresh.checked;
      (on ? draw() : Promise.resolve()).catch(function () {}).then(function () { setTimeout(tick, pollMs); });
    }
    tick();
  }

  // -------------------------------------------------------------- POST actions

  var notice = el("div", {"class": "rq-notice", role: "status", hidden: "hidden"});
  var container = document.querySelector(".container");
  if (container) { container.insertBefore(notice, container.firstChild); }

  function say(msg, ok) {
    notice.textContent = msg;
    notice.className = "rq-notice alert " + (ok ? "alert-success" : "alert-danger");
    notice.removeAttribute("hidden");
  }

  // POST with the action's own CSRF token; resolves with the JSON reply, rejects with why not.
  function post(actionUrl, token, field) {
    var form = new FormData();
    form.append(field || "csrf_token", token);
    return fetch(actionUrl, {method: "POST", body: form, credentials: "same-origin",
                             headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (!r.ok) { return Promise.reject(new Error("refused (HTTP " + r.status + ")")); }
        return r.json();
      });
  }

  function outcome(doc) {
    var s = doc && doc.status;
    if (s === "OK") { return doc.count !== undefined ? "done: " + doc.count + " job(s)" : "done"; }
    return text(s) + (doc && doc.reason ? ": " + text(doc.reason) : "");
  }

  var redraw = function () { return Promise.resolve(); };

  document.querySelectorAll("form.rq-action").forEach(function (form) {
    form.addEventListener("submit", function (e) {
      e.preventDefault();
      var what = form.getAttribute("data-confirm");
      if (what && !window.confirm("Do you really want to " + what + "?")) { return; }
      var field = form.querySelector("input[type=hidden]");
      post(form.getAttribute("action"), field.value, field.name).then(function (doc) {
        say(outcome(doc), doc.status === "OK");
        if (form.getAttribute("data-then") === "queues" && doc.status === "OK") {
          window.location.assign(url.queuesView());
        } else { redraw(); }
      }, function (err) { say(err.message, false); });
    });
  });

  // -------------------------------------------------------------- pages

  function queuesPage() {
    var tbody = document.querySelector("table#queues tbody");
    var cols = [["count", "queued_url", "narrow"], ["deferred_job_registry_count", "deferred_url", "narrow"],
                ["scheduled_job_registry_count", "scheduled_url", "narrow"],
                ["started_job_registry_count", "started_url", "narrow"],
                ["finished_job_registry_count", "finished_url", "narrow"],
                ["failed_job_registry_count", "failed_url", "failed"],
                ["canceled_job_registry_count", "canceled_url", "failed"]];
    redraw = function () {
      return getJSON(url.queuesData()).then(function (doc) {
        var queues = doc.queues || [];
        setRows(tbody, queues.length ? queues.map(function (q) {
          return el("tr", {"data-role": "queue"}, [el("td", {"class": "queue-name"}, [q.name])].concat(
            cols.map(function (c) { return el("td", {"class": c[2]}, [link(q[c[1]], q[c[0]])]); })));
        }) : [emptyRow(8, "No queues.")]);
      });
    };
    every(redraw);
  }

  function workersPage() {
    var tbody = document.querySelector("table#workers tbody");
    var count = document.getElementById("workers-count");
    redraw = function () {
      return getJSON(url.workersData()).then(function (doc) {
        var workers = doc.workers || [];
        count.textContent = workers.length ? workers.length + " workers registered" : "No workers registered!";
        setRows(tbody, workers.length ? workers.map(function (w) {
          var versions = w.version && w.python_version ? "RQ " + w.version + " / Python " + w.python_version : null;
          var job = w.current_job, jobCell;
          if (job && typeof job === "object") {
            jobCell = el("td", {title: "Job ID: " + text(job.job_id) + "\nDescription: " + text(job.description) +
                                       "\nCreated at: " + relative(job.created_at)},
                         [link(url.jobView(job.job_id), job.call_string || job.job_id)]);
          } else {
            jobCell = el("td", {}, [job]);
          }
          return el("tr", {"data-role": "worker"}, [
            el("td", {"class": "worker-name", title: versions}, [w.name]),
            el("td", {"class": "worker-host"}, [w.hostname]),
            jobCell,
            el("td", {"class": "worker-queues"}, [(w.queues || []).join(", ")])
          ]);
        }) : [emptyRow(4, "No workers.")]);
      });
    };
    every(redraw);
  }

  function jobsPage() {
    var q = body.getAttribute("data-queue"), reg = body.getAttribute("data-registry");
    var per = body.getAttribute("data-per-page"), order = body.getAttribute("data-order");
    var pg = parseInt(body.getAttribute("data-page-num"), 10) || 1;
    var tbody = document.querySelector("table#jobs tbody");
    var pages = document.querySelector("div#page-selection ul");

    function rowButton(action, label, cls, confirmText, row) {
      var b = el("button", {type: "button", "class": "btn btn-sm btn-block " + cls}, [label]);
      b.addEventListener("click", function () {
        if (confirmText && !window.confirm("Do you really want to " + confirmText + "?")) { return; }
        post(action.url, action.token).then(function (doc) {
          say(label + " " + text(row.getAttribute("data-job-id")) + ": " + outcome(doc), doc.status === "OK");
          redraw();
        }, function (err) { say(err.message, false); });
      });
      return b;
    }

    function jobRow(j) {
      var row = el("tr", {"data-role": "job", "data-job-id": j.id});
      var name = el("td", {}, [el("span", {"class": "description ellipsify", title: j.description}, [j.description]),
                               el("div", {"class": "job_id"}, [link(url.jobView(j.id), j.id)])]);
      if (j.exc_info) {
        name.appendChild(el("span", {"class": "end_date"}, ["Failed " + relative(j.ended_at)]));
        name.appendChild(el("pre", {"class": "exc_info"}, [j.exc_info]));
      }
      var actions = el("td", {"class": "actions narrow"});
      var acts = j.actions || {};
      if (j.exc_info && acts.requeue) {
        actions.appendChild(rowButton(acts.requeue, "Requeue", "btn-outline-warning", null, row));
      }
      if (acts["delete"]) {
        actions.appendChild(rowButton(acts["delete"], "Delete", "btn-outline-danger", "delete job", row));
      }
      row.appendChild(name);
      row.appendChild(el("td", {}, [el("span", {"class": "creation_date"}, [relative(j.created_at)])]));
      row.appendChild(actions);
      return row;
    }

    function pageItem(target, label, state) {
      var li = el("li", {"class": "page-item" + (state ? " " + state : "")});
      var a = link(target && target.url, label, {"class": "page-link"});
      if (!target) { a.setAttribute("href", "#"); }
      li.appendChild(a);
      return li;
    }

    redraw = function () {
      return getJSON(url.jobsData(q, reg, per, order, pg)).then(function (doc) {
        var jobs = doc.jobs || [], p = doc.pagination || {};
        setRows(tbody, jobs.length ? jobs.map(jobRow) : [emptyRow(3, "No jobs.")]);
        var none = !p.num_pages;
        var items = [pageItem(p.first_page, "\u00ab", p.current_page === 1 || none ? "disabled" : ""),
                     pageItem(none ? null : p.prev_page, "\u2039", !p.prev_page || none ? "disabled" : "")];
        (p.pages_in_window || []).forEach(function (w) {
          items.push(pageItem(w, w.number, w.number === pg ? "active" : ""));
        });
        items.push(pageItem(p.next_page, "\u203a", p.next_page ? "" : "disabled"));
        items.push(pageItem(p.last_page, "\u00bb", p.current_page === p.num_pages || none ? "disabled" : ""));
        setRows(pages, items);
      });
    };
    every(redraw);

    function go() {
      var queue = document.getElementById("select-queue").value || "default";
      window.location.assign(url.jobsView(queue, document.getElementById("select-registry").value,
                                          document.getElementById("select-per-page").value,
                                          document.getElementById("select-sort-order").value, 1));
    }
    ["select-queue", "select-registry", "select-sort-order", "select-per-page"].forEach(function (id) {
      document.getElementById(id).addEventListener("change", go);
    });
  }

  function jobPage() {
    var id = body.getAttribute("data-job-id");
    var requeue = document.getElementById("requeue-job");

    function field(name) { return document.querySelector('[data-field="' + name + '"]'); }

    function pretty(v) {
      if (typeof v === "string") {
        try { return JSON.stringify(JSON.parse(v), null, 2); } catch (e) { return v; }
      }
      return JSON.stringify(v, null, 2);
    }

    redraw = function () {
      return getJSON(url.jobData(id)).then(function (j) {
        ["description", "origin", "status", "exc_info"].forEach(function (k) { field(k).textContent = text(j[k]); });
        field("result").textContent = j.result === undefined ? "" : pretty(j.result);
        field("metadata").textContent = pretty(j.metadata);
        ["created_at", "enqueued_at", "started_at", "ended_at"].forEach(function (k) {
          field(k).textContent = relativeAndShort(j[k]);
        });
        var deps = j.depends_on || [], status = j.depends_on_status || [];
        setRows(field("depends_on"), deps.map(function (d, i) {
          return status[i] === "active" ? el("li", {}, [link(url.jobView(d), d)]) : el("li", {}, [d + " (Expired)"]);
        }));
        if (requeue) { requeue.hidden = j.status !== "failed"; }
      });
    };
    every(redraw);
  }

  var pages = {queues: queuesPage, workers: workersPage, jobs: jobsPage, job: jobPage};
  if (pages[page]) { pages[page](); }
})();
