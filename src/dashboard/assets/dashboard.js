// peerq dashboard: the one script. It refreshes the parts of a page marked
// `data-refresh` every few seconds (their fragment is fetched and swapped
// in, no full reload, a `<details>` left open as it was), and asks before an
// action marked `data-confirm`.
// Pages work without it, minus the refresh.
(function () {
  "use strict";
  function refresh(el) {
    var every = parseInt(el.getAttribute("data-every") || "3000", 10);
    setTimeout(function tick() {
      fetch(el.getAttribute("data-refresh"), { credentials: "same-origin", headers: { "X-Peerq-Fragment": "1" } })
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          // A table the reader opened stays open through the swap.
          var open = Array.prototype.map.call(el.querySelectorAll("details[open][id]"), function (d) { return d.id; });
          el.innerHTML = html;
          el.removeAttribute("data-stale");
          open.forEach(function (id) { var d = document.getElementById(id); if (d) { d.open = true; } });
        })
        .catch(function () { el.setAttribute("data-stale", "1"); })
        .then(function () { setTimeout(tick, every); });
    }, every);
  }
  document.querySelectorAll("[data-refresh]").forEach(refresh);
  document.addEventListener("submit", function (e) {
    var question = e.target.getAttribute("data-confirm");
    if (question && !window.confirm(question)) { e.preventDefault(); }
  });
})();
