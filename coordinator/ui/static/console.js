"use strict";
// The console's only script. It fetches the page's fragment (HTML rendered from the admin
// API's replies) every few seconds, and sends the admin actions to the admin API. The admin
// token lives in this tab's sessionStorage and travels only in the Authorization header.
(() => {
  const TOKEN_KEY = "keyrange.adminToken";
  const base = document.body.dataset.base;
  const view = document.getElementById("view");
  const statusLine = document.getElementById("status");
  const outcomeLine = document.getElementById("outcome");
  const tokenForm = document.getElementById("token-form");
  const tokenInput = document.getElementById("token-input");
  const tokenError = document.getElementById("token-error");
  const forgetButton = document.getElementById("forget-token");
  let acting = false;

  function token() {
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function headers(extra) {
    const all = Object.assign({Accept: "text/html, application/json"}, extra || {});
    const current = token();
    if (current) {
      all.Authorization = "Bearer " + current;
    }
    return all;
  }

  function setStatus(text, state) {
    statusLine.textContent = text;
    statusLine.dataset.state = state;
  }

  // The last action's outcome stays on its own line until the next action.
  function setOutcome(text, state) {
    outcomeLine.textContent = text;
    outcomeLine.dataset.state = state;
  }

  async function problemDetail(response) {
    try {
      const body = await response.json();
      return (body.error ? body.error + ": " : "") + (body.detail || response.statusText);
    } catch (_) {
      return response.status + " " + response.statusText;
    }
  }

  function askForToken(message) {
    view.hidden = true;
    tokenForm.hidden = false;
    forgetButton.hidden = true;
    tokenError.textContent = message;
    setStatus("admin token needed", "locked");
    tokenInput.focus();
  }

  function editing() {
    const focused = document.activeElement;
    return focused !== null && focused.tagName === "INPUT" && view.contains(focused);
  }

  async function refresh() {
    if (acting || editing() || !tokenForm.hidden) {
      return;
    }
    let response;
    try {
      response = await fetch(view.dataset.fragment, {headers: headers(), cache: "no-store"});
    } catch (_) {
      setStatus("coordinator unreachable; retrying", "error");
      return;
    }
    if (response.status === 401 || response.status === 403) {
      const refused = token() !== null;
      sessionStorage.removeItem(TOKEN_KEY);
      askForToken(refused ? await problemDetail(response) : "");
      return;
    }
    if (response.status === 404) {
      // The group was deleted (or never existed): say so rather than keep drawing it.
      const missing = document.createElement("p");
      missing.className = "empty";
      missing.textContent = await problemDetail(response);
      view.replaceChildren(missing);
      view.hidden = false;
      setStatus("not found", "error");
      return;
    }
    if (!response.ok) {
      setStatus(await problemDetail(response), "error");
      return;
    }
    view.innerHTML = await response.text();
    view.hidden = false;
    forgetButton.hidden = token() === null;
    setStatus("updated " + new Date().toLocaleTimeString(), "ready");
  }

  async function act(confirmation, method, path, body) {
    if (!window.confirm(confirmation)) {
      return;
    }
    acting = true;
    let outcome;
    try {
      const init = {method: method, headers: headers({"Content-Type": "application/json"})};
      if (body !== undefined) {
        init.body = JSON.stringify(body);
      }
      const response = await fetch(base + path, init);
      outcome = response.ok
        ? ["done: " + confirmation.split("?")[0], "done"]
        : ["refused: " + (await problemDetail(response)), "refused"];
    } catch (_) {
      outcome = ["coordinator unreachable; nothing was sent", "error"];
    } finally {
      acting = false;
    }
    setOutcome(outcome[0], outcome[1]);
    await refresh();
  }

  view.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button === null) {
      return;
    }
    const data = button.dataset;
    if (data.action === "remove-member") {
      act(
        "Remove member " + data.member + " from group " + data.group +
          "? Its key ranges go to the other members, as if its session had expired.",
        "DELETE",
        "/v1/admin/groups/" + encodeURIComponent(data.group) + "/members/" +
          encodeURIComponent(data.member),
      );
    } else if (data.action === "range-fetch") {
      const enable = data.enable === "true";
      act(
        "Turn accept.range.fetch " + (enable ? "on" : "off") + " for topic " + data.topic + "?",
        "PUT",
        "/v1/admin/topics/" + encodeURIComponent(data.topic) + "/config",
        {accept_range_fetch: enable},
      );
    }
  });

  view.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-action='reset']");
    if (form === null) {
      return;
    }
    event.preventDefault();
    const data = form.dataset;
    const raw = form.elements.to_offset.value.trim();
    const toOffset = raw === "" ? null : Number(raw);
    if (toOffset !== null && !(Number.isSafeInteger(toOffset) && toOffset >= 0)) {
      setOutcome("the offset must be a whole number, 0 or more", "refused");
      return;
    }
    form.elements.to_offset.blur();
    act(
      (toOffset === null
        ? "Drop the IC ranges and watermarks of topic " + data.topic
        : "Reset the stable offset of every partition of topic " + data.topic + " to " + toOffset) +
        " in group " + data.group + "?",
      "POST",
      "/v1/admin/groups/" + encodeURIComponent(data.group) + "/offsets/reset",
      {topic: data.topic, partitions: null, to_offset: toOffset},
    );
  });

  tokenForm.addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, tokenInput.value.trim());
    tokenInput.value = "";
    tokenForm.hidden = true;
    refresh();
  });

  forgetButton.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    askForToken("");
  });

  refresh();
  window.setInterval(refresh, Number(view.dataset.refreshMs));
})();
