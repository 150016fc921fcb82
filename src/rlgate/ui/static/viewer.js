// rlgate trajectory viewer: filters, tokens/messages toggle, colour scale, token tooltips and,
// in the static export, view switching by URL fragment. Reads only data-* attributes and
// textContent; never builds HTML from data (everything was escaped when the page was made).
(function () {
  "use strict";
  var doc = document;

  function applyFilters(form) {
    var f = new FormData(form);
    var task = String(f.get("task") || "").toLowerCase(), policy = String(f.get("policy") || "");
    var rmin = parseFloat(f.get("rmin")), rmax = parseFloat(f.get("rmax"));
    var rel = String(f.get("relation") || ""), fail = String(f.get("failures") || "");
    var rows = doc.querySelectorAll("tr.srow"), shown = 0;
    for (var i = 0; i < rows.length; i++) {
      var d = rows[i].dataset, ok = true, r = parseFloat(d.reward);
      var flags = d.flags ? d.flags.split(" ") : [];
      if (task && d.task.toLowerCase().indexOf(task) < 0) ok = false;
      if (ok && policy && d.policy !== policy) ok = false;
      if (ok && !isNaN(rmin) && !(r >= rmin)) ok = false;
      if (ok && !isNaN(rmax) && !(r <= rmax)) ok = false;
      if (ok && rel && d.relations.split(" ").indexOf(rel) < 0) ok = false;
      if (ok && fail === "*" && flags.length === 0) ok = false;
      if (ok && fail === "-" && flags.length > 0) ok = false;
      if (ok && fail && fail !== "*" && fail !== "-" && flags.indexOf(fail) < 0) ok = false;
      rows[i].hidden = !ok;
      if (ok) shown++;
    }
    var count = doc.getElementById("count");
    if (count) count.textContent = shown + " of " + rows.length + " sessions";
  }

  function onFilter(ev) {
    var form = ev.target.closest && ev.target.closest("#filters");
    if (form) applyFilters(form);
  }
  doc.addEventListener("input", onFilter);
  doc.addEventListener("change", onFilter);  // some browsers send only "change" for a <select>
  doc.addEventListener("submit", function (ev) {
    if (ev.target.id === "filters") { ev.preventDefault(); applyFilters(ev.target); }
  });

  doc.addEventListener("click", function (ev) {
    var b = ev.target.closest && ev.target.closest("button.toggle");
    if (!b) return;
    var view = b.closest("main").querySelector(".turnview");
    if (!view) return;
    view.classList.remove("show-tokens", "show-messages");
    view.classList.add("show-" + b.dataset.show);
  });

  doc.addEventListener("change", function (ev) {
    if (!ev.target.classList || !ev.target.classList.contains("colour")) return;
    var strip = ev.target.closest("main").querySelector(".strip");
    if (!strip) return;
    strip.classList.remove("colour-logprob", "colour-version", "colour-loss");
    strip.classList.add("colour-" + ev.target.value);
  });

  var KIND = { p: "prompt", c: "context (parent turn)", b: "bridge / glue", g: "generated" };
  doc.addEventListener("mouseover", function (ev) {
    var t = ev.target.closest ? ev.target.closest("[data-token-id]") : null, tip = doc.getElementById("tip");
    if (!tip) return;
    if (!t) { tip.hidden = true; return; }
    var lp = parseFloat(t.dataset.logprob), gen = t.dataset.loss === "1";
    tip.textContent = "token " + t.dataset.tokenId + "  " + JSON.stringify(t.textContent) + "\n" +
      KIND[t.className.charAt(0)] + (gen ? "  logprob " + lp.toFixed(4) + "  p " + Math.exp(lp).toFixed(3) +
      "  version " + t.dataset.version : "") + "  loss " + t.dataset.loss;
    var box = t.getBoundingClientRect();
    tip.style.left = Math.min(box.left, window.innerWidth - 360) + "px";
    tip.hidden = false;
    var below = box.bottom + 4 + tip.offsetHeight < window.innerHeight;
    tip.style.top = (below ? box.bottom + 4 : box.top - 4 - tip.offsetHeight) + "px";
  });

  // Static export: every view is the text of a <script type="text/html" data-view="KEY"> (HTML
  // rendered and escaped by rlgate view); the fragment names the view to show.
  if (doc.body.dataset.mode !== "static") return;
  var views = new Map();
  doc.querySelectorAll("script[type='text/html'][data-view]").forEach(function (t) {
    views.set(t.dataset.view, t);
  });
  var main = doc.querySelector("main");
  function show() {
    var key = decodeURIComponent(location.hash.slice(1)) || "home";
    var t = views.get(key) || views.get("home");
    main.innerHTML = t.textContent;
    main.dataset.view = views.has(key) ? key : "home";
    var form = doc.getElementById("filters");
    if (form) applyFilters(form);
    window.scrollTo(0, 0);
  }
  window.addEventListener("hashchange", show);
  show();
})();
