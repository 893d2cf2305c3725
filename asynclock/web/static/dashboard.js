// asynclock dashboard: refreshes the page's fragments, keeps the view in the URL, and asks
// before every action. Served by the dashboard itself; nothing is loaded from elsewhere.
"use strict";
(() => {
  const body = document.body;
  const root = body.dataset.root || "";
  const every = Math.max(200, parseFloat(body.dataset.refresh || "2") * 1000);
  const csrf = body.dataset.csrf || "";
  const parts = ["status", "totals", "chart", "keys", "dead", "locks"];
  const view = new URLSearchParams(location.search);
  let paused = false;
  let timer = null;
  let running = null;
  let failures = 0;
  let refreshes = 0;

  const $ = (id) => document.getElementById(id);

  // <time datetime="...Z"> elements: the server writes UTC, the reader wants local time
  function localize(scope) {
    for (const element of scope.querySelectorAll("time[datetime]")) {
      const when = new Date(element.getAttribute("datetime"));
      if (!Number.isNaN(when.getTime())) {
        element.textContent = when.toLocaleTimeString();
        element.title = when.toString();
      }
    }
  }

  function setView(name, value) {
    if (value === "" || value === null || value === undefined) view.delete(name);
    else view.set(name, value);
    const query = view.toString();
    history.replaceState(null, "", query ? "?" + query : location.pathname);
  }

  function toast(text, bad) {
    const element = $("toast");
    element.textContent = text;
    element.className = bad ? "bad" : "good";
    element.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { element.hidden = true; }, bad ? 15000 : 6000);
  }

  function schedule() {
    clearTimeout(timer);
    if (paused || document.hidden) return;
    // a dashboard that stopped answering is asked less and less often, up to every 30 s
    const wait = failures ? Math.min(every * 2 ** failures, 30000) : every;
    timer = setTimeout(refresh, wait);
  }

  function refresh() {
    clearTimeout(timer);
    if (running) return running;
    running = (async () => {
      try {
        const answer = await fetch(root + "/api/refresh?" + view.toString(), {
          headers: { accept: "application/json" },
          cache: "no-store",
          credentials: "same-origin",
        });
        if (!answer.ok) throw new Error("HTTP " + answer.status);
        const data = await answer.json();
        for (const id of parts) {
          const element = $(id);
          if (element && id in data.fragments) {
            element.innerHTML = data.fragments[id];
            localize(element);
          }
        }
        failures = 0;
        refreshes += 1;
        body.dataset.refreshes = String(refreshes);
        body.classList.remove("offline");
      } catch (error) {
        failures += 1;
        body.classList.add("offline");
        $("status").textContent = "the dashboard is not answering (" + error.message + "); retrying";
      } finally {
        running = null;
        schedule();
      }
    })();
    return running;
  }

  function ask(question, label) {
    return new Promise((resolve) => {
      const dialog = $("confirm");
      $("confirm-text").textContent = question;
      $("confirm-ok").textContent = label;
      dialog.returnValue = "";
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
      dialog.showModal();
      $("confirm-ok").focus();
    });
  }

  async function act(button) {
    if (!(await ask(button.dataset.confirm, button.textContent))) return;
    const request = { key: button.dataset.key };
    if (button.dataset.token) request.token = button.dataset.token;
    button.disabled = true;
    try {
      const answer = await fetch(root + "/api/" + button.dataset.action, {
        method: "POST",
        headers: { "content-type": "application/json", "x-csrf-token": csrf },
        body: JSON.stringify(request),
        credentials: "same-origin",
      });
      const data = await answer.json().catch(() => ({}));
      toast(answer.ok ? data.message : data.error || "HTTP " + answer.status, !answer.ok);
    } catch (error) {
      toast("the action was not sent: " + error.message, true);
    } finally {
      button.disabled = false;
      refresh();
    }
  }

  async function showPayload(button) {
    const query = new URLSearchParams({ key: button.dataset.payloadKey, id: button.dataset.payloadId });
    const answer = await fetch(root + "/api/payload?" + query.toString(), { cache: "no-store" });
    const data = await answer.json().catch(() => ({}));
    if (!answer.ok) {
      toast(data.error || "HTTP " + answer.status, true);
      return;
    }
    let text = data.payload;
    try { text = JSON.stringify(JSON.parse(text), null, 2); } catch (_) { /* not JSON: as is */ }
    $("payload-title").textContent = "Payload of dead letter #" + data.id + " of " + JSON.stringify(data.key);
    $("payload-text").textContent = text;
    $("payload").showModal();
  }

  document.addEventListener("click", (event) => {
    const target = event.target instanceof Element ? event.target : null;
    const link = target && target.closest("a[data-view]");
    if (link) {
      event.preventDefault();
      setView(link.dataset.view, link.dataset.value === "1" ? "" : link.dataset.value);
      if (link.dataset.view === "sort") setView("kp", "");
      refresh();
      return;
    }
    const button = target && target.closest("button[data-action]");
    if (button) { act(button); return; }
    const payload = target && target.closest("button[data-payload-key]");
    if (payload) showPayload(payload);
  });

  let typing = null;
  $("filter").addEventListener("input", (event) => {
    clearTimeout(typing);
    typing = setTimeout(() => {
      setView("q", event.target.value.trim());
      for (const page of ["kp", "dp", "lp"]) setView(page, "");
      refresh();
    }, 250);
  });
  $("sort").addEventListener("change", (event) => {
    setView("sort", event.target.value === "age" ? "" : event.target.value);
    setView("kp", "");
    refresh();
  });
  document.querySelector("form.filter").addEventListener("submit", (event) => event.preventDefault());
  $("pause").addEventListener("click", (event) => {
    paused = !paused;
    event.target.textContent = paused ? "Resume" : "Pause";
    event.target.setAttribute("aria-pressed", String(paused));
    body.classList.toggle("paused", paused);
    if (paused) clearTimeout(timer); else refresh();
  });
  // a hidden tab costs the state nothing; it catches up as soon as it is shown again
  document.addEventListener("visibilitychange", () => {
    if (document.hidden) clearTimeout(timer); else if (!paused) refresh();
  });

  localize(document);
  schedule();
})();
