/*
 * Switchboard operator console. Plain JavaScript, no build step, nothing loaded from elsewhere.
 *
 * The sessions list and the open session's transcript arrive live over server-sent events (/console/api/stream,
 * EventSource); where that is not available or keeps failing, the page reads /console/api/* every few seconds
 * instead. Every write is a POST carrying the CSRF token of the sign-in (X-CSRF-Token). Every string from the server
 * (message text, tool arguments, untrusted tool output) is put in the page with textContent: nothing is ever parsed
 * as HTML.
 */
"use strict";

(() => {
  const POLL_MS = 5000; // only when the live stream is not available
  const PANEL_MS = 10000; // budgets, people and schedules: read again this often while their tab is shown
  const RECONNECT_MS = 10000;
  const API = "/console/api/";

  let csrf = "";
  let tab = "sessions";
  let selected = null; // the session key whose transcript is shown
  let timer = null;
  let busy = false;
  let again = false;
  let stream = null; // the EventSource, while live
  let live = false;
  let filters = {};
  let rawShown = false;
  let memory = null; // the project whose facts are shown: {tenant, name}
  let canAct = false; // a viewer watches: no write control is shown (the server refuses their writes anyway)

  const $ = (id) => document.getElementById(id);
  const notice = $("notice");

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (className) node.className = className;
    return node;
  }

  function when(seconds) {
    if (typeof seconds !== "number" || !seconds) return "";
    return new Date(seconds * 1000).toLocaleString();
  }

  function pretty(value) {
    if (value === undefined || value === null || value === "") return el("span", "");
    if (typeof value === "string") return el("span", value);
    return el("pre", JSON.stringify(value, null, 2));
  }

  function row(cells, attrs) {
    const tr = document.createElement("tr");
    for (const [key, value] of Object.entries(attrs || {})) tr.setAttribute(key, value);
    for (const cell of cells) {
      const td = document.createElement("td");
      if (cell instanceof Node) td.appendChild(cell);
      else td.textContent = cell === undefined || cell === null ? "" : String(cell);
      tr.appendChild(td);
    }
    return tr;
  }

  function button(label, testid, onClick) {
    const b = el("button", label);
    b.type = "button";
    b.dataset.testid = testid;
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        await onClick();
      } finally {
        b.disabled = false;
      }
    });
    return b;
  }

  /** A write button, or nothing for a viewer. */
  function act(label, testid, onClick) {
    return canAct ? button(label, testid, onClick) : "";
  }

  function say(message, isError) {
    notice.textContent = message;
    notice.classList.toggle("error", Boolean(isError));
    notice.hidden = !message;
  }

  async function call(method, path, body) {
    const init = { method, credentials: "same-origin", headers: {} };
    if (method !== "GET") {
      init.headers["X-CSRF-Token"] = csrf;
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body || {});
    }
    const response = await fetch(API + path, init);
    if (response.status === 401) {
      window.location.assign("/console/login");
      throw new Error("signed out");
    }
    let data = null;
    try {
      data = await response.json();
    } catch (_) {
      data = null;
    }
    if (!response.ok) {
      const message = data && data.error && data.error.message ? data.error.message : `HTTP ${response.status}`;
      throw new Error(message);
    }
    return data;
  }

  async function write(path, body, done) {
    try {
      const data = await call("POST", path, body);
      say(done || (data && data.message) || "Done.", false);
      await refresh();
      return data;
    } catch (err) {
      say(err.message, true);
      return null;
    }
  }

  /* ---------- sessions ---------- */

  function query(extra) {
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries({ ...filters, ...(extra || {}) })) if (value) params.set(name, value);
    const text = params.toString();
    return text ? `?${text}` : "";
  }

  function renderSessions(sessions) {
    const body = $("sessions-body");
    body.replaceChildren();
    for (const s of sessions) {
      const tr = row(
        [el("code", s.key), s.channel, s.agent, s.state, when(s.last_activity), s.inbox_depth, s.controlled_by || "agent"],
        { "data-key": s.key, "data-testid": "session-row", "data-state": s.state, "data-channel": s.channel },
      );
      if (s.key === selected) tr.classList.add("selected");
      tr.addEventListener("click", () => {
        selected = s.key;
        for (const other of body.querySelectorAll("tr.selected")) other.classList.remove("selected");
        tr.classList.add("selected");
        connect();
        if (!live) refresh();
      });
      body.appendChild(tr);
    }
  }

  async function loadSessions() {
    const data = await call("GET", `sessions${query()}`);
    renderSessions(data.sessions);
    if (selected) await loadTranscript();
  }

  function who(line) {
    switch (line.kind) {
      case "user":
        return `user ${line.actor}${line.action === "queued" ? " (waiting for the agent)" : ""}`;
      case "agent":
        return "agent";
      case "tool_call":
        return `tool call: ${line.tool || "?"}${line.ok === false ? " (failed)" : ""}`;
      case "approval":
        return `approval: ${line.tool || "reply"} (${line.action})`;
      case "operator":
        return `operator ${line.actor}: ${line.action.replace(/_/g, " ")}`;
      default:
        return line.action ? line.action.replace(/_/g, " ") : line.kind;
    }
  }

  function transcriptLine(line) {
    const li = el("li", null, `line line-${line.kind}`);
    li.dataset.testid = "transcript-line";
    li.dataset.kind = line.kind;
    const head = el("span", `${when(line.at)} · ${who(line)}`, "who");
    li.appendChild(head);
    if (line.redacted) {
      li.appendChild(el("p", "(withheld for your role)", "words redacted"));
    } else {
      if (line.text) li.appendChild(el("p", line.text, "words"));
      if (line.kind === "tool_call") {
        if (line.arguments !== null && line.arguments !== undefined) {
          const args = el("pre", JSON.stringify(line.arguments, null, 2));
          args.dataset.testid = "tool-arguments";
          li.appendChild(args);
        }
        if (line.result !== null && line.result !== undefined) {
          if (line.untrusted) li.appendChild(el("span", "untrusted output, shown as data", "untrusted"));
          const result = el("pre", line.result, "data");
          result.dataset.testid = "tool-result";
          li.appendChild(result);
        }
      }
    }
    if (line.events && line.events.length) {
      const details = document.createElement("details");
      details.dataset.testid = "line-events";
      details.appendChild(el("summary", `${line.events.length} event${line.events.length === 1 ? "" : "s"}`));
      details.appendChild(
        el("pre", line.events.map((e) => `${e.kind}  ${e.trace_id || ""}\n${JSON.stringify(e.data)}`).join("\n")),
      );
      li.appendChild(details);
    }
    return li;
  }

  function renderDetail(data) {
    if (data.session !== selected) return;
    $("session-detail").hidden = false;
    $("detail-key").textContent = data.session;
    $("detail-state").textContent = data.state + (data.controlled_by ? ` (taken over by ${data.controlled_by})` : "");
    $("detail-state").dataset.state = data.state;
    const taken = Boolean(data.controlled_by);
    $("takeover").disabled = taken;
    $("handback").disabled = !taken;
    $("redacted-note").hidden = !data.redacted;
    $("detail-approvals").replaceChildren(...data.approvals.map(approvalCard));
    $("transcript").replaceChildren(...data.transcript.map(transcriptLine));
    if (rawShown) loadTimeline().catch((err) => say(err.message, true));
  }

  async function loadTranscript() {
    renderDetail(await call("GET", `transcript?session=${encodeURIComponent(selected)}`));
  }

  async function loadTimeline() {
    const data = await call("GET", `timeline?session=${encodeURIComponent(selected)}`);
    const body = $("timeline-body");
    body.replaceChildren();
    for (const e of data.events) {
      body.appendChild(
        row([when(e.at), e.type, el("code", e.trace_id || ""), pretty(e.data)], {
          "data-testid": "timeline-row",
          "data-type": e.type,
        }),
      );
    }
  }

  $("raw-toggle").addEventListener("click", async () => {
    rawShown = !rawShown;
    $("raw-toggle").setAttribute("aria-expanded", String(rawShown));
    $("raw-timeline").hidden = !rawShown;
    if (rawShown && selected) {
      try {
        await loadTimeline();
      } catch (err) {
        say(err.message, true);
      }
    }
  });

  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = new FormData($("filters"));
    filters = {};
    for (const name of ["channel", "agent", "tenant", "state"]) filters[name] = String(form.get(name) || "").trim();
    connect();
    if (!live) refresh();
  });
  $("filters").addEventListener("reset", () => {
    filters = {};
    setTimeout(() => {
      connect();
      if (!live) refresh();
    });
  });

  /* ---------- live updates ---------- */

  function showLive(text) {
    $("live").textContent = text;
  }

  function poll() {
    if (timer === null) timer = setInterval(refresh, POLL_MS);
  }

  function connect() {
    if (stream) stream.close();
    stream = null;
    if (!window.EventSource) {
      live = false;
      showLive("refreshing every few seconds");
      poll();
      return;
    }
    const source = new EventSource(API + "stream" + query(selected ? { session: selected } : {}));
    stream = source;
    source.addEventListener("open", () => {
      live = true;
      showLive("live");
      if (timer !== null) {
        clearInterval(timer);
        timer = null;
      }
    });
    source.addEventListener("sessions", (event) => {
      renderSessions(JSON.parse(event.data));
      loadApprovals().catch(() => {});
    });
    source.addEventListener("transcript", (event) => renderDetail(JSON.parse(event.data)));
    source.addEventListener("problem", (event) => say(JSON.parse(event.data).message, true));
    source.addEventListener("signed_out", () => {
      source.close();
      window.location.assign("/console/login");
    });
    source.addEventListener("error", () => {
      if (source !== stream || source.readyState !== EventSource.CLOSED) return; // the browser reconnects itself
      live = false;
      stream = null;
      showLive("reconnecting… (refreshing every few seconds meanwhile)");
      poll();
      setTimeout(() => {
        if (stream === null) connect();
      }, RECONNECT_MS);
    });
  }

  $("takeover").addEventListener("click", () => write("sessions/take-over", { session: selected }, "Taken over."));
  $("handback").addEventListener("click", () => write("sessions/hand-back", { session: selected }, "Handed back."));
  $("say-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const input = $("say-input");
    const text = input.value.trim();
    if (!text || !selected) return;
    if (await write("sessions/say", { session: selected, text }, "Sent.")) input.value = "";
  });

  /* ---------- approvals ---------- */

  function approvalCard(a) {
    const card = el("article", null, "card");
    card.dataset.testid = "approval-card";
    card.dataset.id = a.id;
    card.appendChild(el("h3", `${a.kind === "reply" ? "Reply" : a.tool} — ${a.id}`));
    const dl = document.createElement("dl");
    const fields = [
      ["Session", a.session],
      ["Tool", a.tool],
      ["Arguments", a.arguments],
      ["Resources", a.resources],
      ["Reason", a.reason],
      ["Policy version", a.policy_version],
      ["Requested by", a.requester],
      ["Requested", when(a.requested_at)],
      ["Expires", when(a.expires_at)],
      ["Action hash", a.action_sha256],
    ];
    for (const [name, value] of fields) {
      dl.appendChild(el("dt", name));
      const dd = document.createElement("dd");
      dd.dataset.field = name.toLowerCase().replace(/ /g, "_");
      dd.appendChild(pretty(value));
      dl.appendChild(dd);
    }
    card.appendChild(dl);
    const decide = (verdict) => () =>
      write("approvals/decide", { session: a.session, id: a.id, verdict }, verdict === "approve" ? "Approved." : "Denied.");
    if (canAct) {
      card.appendChild(button("Approve", "approve-button", decide("approve")));
      card.appendChild(document.createTextNode(" "));
      card.appendChild(button("Deny", "deny-button", decide("deny")));
    }
    return card;
  }

  async function loadApprovals() {
    const data = await call("GET", "approvals");
    $("approval-count").textContent = data.approvals.length ? String(data.approvals.length) : "";
    if (tab !== "approvals") return;
    $("approvals-empty").hidden = data.approvals.length > 0;
    $("approvals-list").replaceChildren(...data.approvals.map(approvalCard));
  }

  /* ---------- dead letters, reconciliation, agents, usage ---------- */

  async function loadDead() {
    const data = await call("GET", "dead-letters");
    $("dead-body").replaceChildren(
      ...data.dead_letters.map((d) =>
        row(
          [
            el("code", d.session),
            el("code", d.id),
            `${d.reason} (${d.attempts} attempts)${d.preview ? `: ${d.preview}` : ""}`,
            when(d.at),
            d.requeued
              ? "requeued"
              : act("Requeue", "requeue-button", () => write("dead-letters/requeue", { session: d.session, id: d.id })),
          ],
          { "data-testid": "dead-row" },
        ),
      ),
    );
  }

  async function loadEffects() {
    const data = await call("GET", "effects");
    $("effects-body").replaceChildren(
      ...data.effects.map((f) => {
        const resolve = (outcome) => () =>
          write("effects/resolve", { session: f.session, key: f.key, outcome }, `Marked ${outcome}.`);
        const actions = el("span");
        if (canAct) actions.append(button("Done", "resolve-done", resolve("done")), " ", button("Failed", "resolve-failed", resolve("failed")));
        return row([el("code", f.session), f.tool, el("code", f.key), when(f.started_at), pretty({ run: f.run_id, action: f.action_sha256, ...f.info }), actions], {
          "data-testid": "effect-row",
        });
      }),
    );
  }

  async function loadAgents() {
    const data = await call("GET", "agents");
    $("agents-body").replaceChildren(
      ...data.agents.map((a) =>
        row(
          [
            a.name,
            a.status,
            a.model,
            (a.tools || []).map((t) => `${t.name} (${t.side_effect}, ${t.risk} risk)`).join(", "),
            `${a.credits} credits in ${a.runs} runs` + (a.max_credits === null ? "" : ` (at most ${a.max_credits} a run)`),
          ],
          { "data-testid": "agent-row", "data-agent": a.name },
        ),
      ),
    );
  }

  async function loadDrafts() {
    const data = await call("GET", "drafts");
    $("drafts-body").replaceChildren(
      ...data.drafts.map((d) => {
        const target = { tenant: d.tenant, name: d.name };
        const actions = el("span");
        if (canAct)
          actions.append(
            button("Accept", "draft-accept", () => write("drafts/accept", target, `Accepted ${d.name}: served from each process's next start.`)),
            " ",
            button("Reject", "draft-reject", () => write("drafts/reject", target, `Rejected ${d.name}.`)),
          );
        return row([d.tenant, `${d.name} (${d.display_name})`, d.proposed_by, d.instructions, (d.tools || []).join(", ") || "none", actions], {
          "data-testid": "draft-row",
        });
      }),
    );
  }

  async function loadUsage() {
    const data = await call("GET", "usage");
    $("usage-body").replaceChildren(
      ...data.usage.map((u) =>
        row([u.tenant, u.agent, u.credits, u.input_tokens, u.output_tokens, u.runs], { "data-testid": "usage-row" }),
      ),
    );
  }

  async function loadAccess() {
    const data = await call("GET", "access");
    const rows = [];
    for (const t of data.tenants) {
      for (const p of t.paired) {
        const revoke = () => write("access/revoke", { tenant: t.tenant, principal: p.principal }, `Revoked ${p.principal}.`);
        rows.push(row([t.tenant, el("code", p.principal), "paired", p.role || "default", when(p.at), act("Revoke", "access-revoke", revoke)], { "data-testid": "access-row" }));
      }
      for (const r of t.requests) rows.push(row([t.tenant, el("code", r.principal), "waiting for approval", "", when(r.expires_at), ""], { "data-testid": "access-row" }));
    }
    $("access-body").replaceChildren(...rows);
  }

  $("access-approve").addEventListener("submit", async (event) => {
    event.preventDefault();
    const done = await write("access/approve", { code: $("access-code").value }, "Paired.");
    if (done) $("access-code").value = "";
  });


  /* ---------- budgets, people, schedules ---------- */

  function credits(value) {
    return Number(value).toLocaleString(undefined, { maximumFractionDigits: 2 });
  }

  function share(fraction) {
    return `${Number((fraction * 100).toFixed(1))}%`;
  }

  function spend(spent, budget) {
    const cell = el("span", null, "spend");
    const bar = document.createElement("meter");
    bar.min = 0;
    bar.max = budget;
    bar.value = Math.min(spent, budget);
    bar.low = budget * 0.8;
    bar.high = budget * 0.999;
    bar.optimum = 0;
    bar.dataset.testid = "budget-bar";
    cell.append(bar, el("span", `${credits(spent)} / ${credits(budget)} (${share(budget ? spent / budget : 0)})`));
    return cell;
  }

  async function loadBudgets() {
    const data = await call("GET", "budgets");
    $("budgets-empty").hidden = data.budgets.length > 0;
    $("budgets-body").replaceChildren(
      ...data.budgets.map((b) =>
        row(
          [
            b.tenant,
            b.scope,
            el("code", b.subject),
            b.period,
            spend(b.spent, b.credits),
            b.alerts.length ? b.alerts.map(share).join(", ") : "none",
            when(b.resets_at),
          ],
          { "data-testid": "budget-row", "data-scope": b.scope },
        ),
      ),
    );
    $("budget-alerts-empty").hidden = data.alerts.length > 0;
    $("budget-alerts-body").replaceChildren(
      ...data.alerts.map((a) =>
        row([when(a.at), a.tenant, a.scope, el("code", a.subject), a.period, share(a.threshold), `${credits(a.spent)} / ${credits(a.credits)}`], {
          "data-testid": "budget-alert-row",
        }),
      ),
    );
    showFigures(data);
  }

  function seconds(value) {
    return value === null ? "–" : `${value.toFixed(value < 10 ? 2 : 0)} s`;
  }

  function showFigures(data) {
    $("agent-figures-empty").hidden = data.agents.length > 0;
    $("agent-figures-body").replaceChildren(
      ...data.agents.map((a) =>
        row(
          [a.agent, el("code", a.version), a.tenant, String(a.turns), `${seconds(a.p50_s)} / ${seconds(a.p95_s)}`,
            a.cost_per_task === null ? "–" : credits(a.cost_per_task), String(a.timeouts), String(a.stops)],
          { "data-testid": "agent-figures-row" },
        ),
      ),
    );
    $("tool-figures-empty").hidden = data.tools.length > 0;
    const outcomes = ["ok", "approval", "validation", "timeout", "refused", "error"];
    $("tool-figures-body").replaceChildren(
      ...data.tools.map((t) =>
        row([t.agent, el("code", t.tool), t.tenant, ...outcomes.map((o) => String(t.outcomes[o] || 0)), String(t.retries)], {
          "data-testid": "tool-figures-row",
        }),
      ),
    );
    $("run-figures-empty").hidden = data.runs.length > 0;
    $("run-figures-body").replaceChildren(
      ...data.runs.map((r) =>
        row([r.agent, r.tenant, String(r.failed), String(r.cancelled)], { "data-testid": "run-figures-row" }),
      ),
    );
  }

  async function loadPeople() {
    const data = await call("GET", "people");
    $("people-empty").hidden = data.people.length > 0;
    $("people-body").replaceChildren(
      ...data.people.map((p) => {
        const list = el("ul", null, "principals");
        for (const principal of p.principals) {
          const item = el("li");
          item.dataset.testid = "person-principal";
          item.dataset.principal = principal;
          const unlink = () => write("people/unlink", { tenant: p.tenant, principal }, `Unlinked ${principal} from ${p.person}.`);
          item.append(el("code", principal), " ", act("Unlink", "people-unlink", unlink));
          list.appendChild(item);
        }
        return row([p.tenant, el("code", p.person), list], { "data-testid": "person-row", "data-person": p.person });
      }),
    );
  }

  $("people-link").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("people-link").elements;
    const principals = form.namedItem("principals").value.split(/[\s,]+/).filter(Boolean);
    const person = form.namedItem("person").value.trim();
    const body = { tenant: form.namedItem("tenant").value.trim(), principals, person };
    if (await write("people/link", body, `Linked ${principals.join(" ")} as ${person}.`)) {
      form.namedItem("principals").value = "";
      form.namedItem("person").value = "";
    }
  });

  function schedule(j) {
    if (j.cron) return `cron ${j.cron} (${j.timezone})`;
    return `once at ${j.at}${j.timezone && j.timezone !== "UTC" ? ` (${j.timezone})` : ""}`;
  }

  function outcome(j) {
    const cell = el("div");
    const last = el("span", j.last_outcome || "not run yet", `outcome outcome-${j.last_outcome || "none"}`);
    last.dataset.testid = "schedule-outcome";
    cell.append(last, el("span", ` · fired ${j.fired}, skipped ${j.skipped}`, "state"));
    if (j.last_reason) {
      const why = el("p", j.last_reason, "reason");
      why.dataset.testid = "schedule-reason";
      cell.appendChild(why);
    }
    return cell;
  }

  async function loadSchedules() {
    const data = await call("GET", "schedules");
    $("schedules-empty").hidden = data.schedules.length > 0;
    $("schedules-body").replaceChildren(
      ...data.schedules.map((j) => {
        const does = el("div");
        does.append(el("strong", j.action === "turn" ? "runs a turn on" : "sends"), " ", el("span", j.text, "job-text"));
        if (j.template) does.appendChild(el("p", `outside the window: template ${j.template.name} (${j.template.language})`, "state"));
        const actions = el("span", null, "actions");
        if (canAct) {
          actions.append(
            button("Run now", "schedule-run-now", () => write("schedules/run-now", { id: j.id }, `Ran ${j.id} once.`)),
            " ",
            button("Remove", "schedule-remove", () => write("schedules/remove", { id: j.id }, `Removed ${j.id}.`)),
          );
        }
        return row(
          [el("code", j.id), does, el("code", j.session), schedule(j), j.next_at ? when(j.next_at) : "never again", outcome(j), actions],
          { "data-testid": "schedule-row", "data-id": j.id },
        );
      }),
    );
  }

  $("schedule-add").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("schedule-add").elements;
    const value = (name) => form.namedItem(name).value.trim();
    const body = {
      id: value("id"),
      target: { channel: value("channel"), conversation: value("conversation") },
      action: value("action"),
      text: form.namedItem("text").value,
      timezone: value("timezone") || "UTC",
      [value("when") === "cron" ? "cron" : "at"]: value("schedule"),
    };
    if (await write("schedules", body, `Scheduled ${body.id}.`)) {
      for (const name of ["id", "text", "schedule"]) form.namedItem(name).value = "";
    }
  });

  /* ---------- memory ---------- */

  function memoryQuery(params) {
    return `?${new URLSearchParams(params).toString()}`;
  }

  async function loadMemory() {
    const data = await call("GET", "memory/projects");
    $("memory-projects-empty").hidden = data.projects.length > 0;
    $("memory-projects-body").replaceChildren(
      ...data.projects.map((p) => {
        const here = el("ul", null, "principals");
        for (const agent of p.connected) {
          const item = el("li");
          const off = () => write("memory/disconnect", { agent, project: p.name }, `Disconnected ${agent} from ${p.name}.`);
          item.append(el("code", agent), " ", act("Disconnect", "memory-disconnect", off));
          here.appendChild(item);
        }
        const open = button("Facts", "memory-open", async () => {
          memory = { tenant: p.tenant, name: p.name };
          $("memory-history").hidden = true;
          await refresh();
        });
        return row([el("code", p.name), p.tenant, p.facts, p.agents.join(", "), here, open], {
          "data-testid": "memory-project-row",
          "data-project": p.name,
        });
      }),
    );
    const shown = memory !== null && data.projects.some((p) => p.name === memory.name && p.tenant === memory.tenant);
    $("memory-facts-title").hidden = !shown;
    $("memory-facts").hidden = !shown;
    if (!shown) {
      $("memory-facts-empty").hidden = true;
      return;
    }
    $("memory-facts-title").textContent = `Facts of ${memory.name} (tenant ${memory.tenant})`;
    const facts = (await call("GET", `memory/facts${memoryQuery({ tenant: memory.tenant, project: memory.name })}`)).facts;
    $("memory-facts-empty").hidden = facts.length > 0;
    $("memory-facts-body").replaceChildren(...facts.map(factRow));
  }

  function factRow(f) {
    const tenant = f.tenant;
    const source = el("span", `${f.source.kind} ${f.source.ref || ""}`.trim());
    if (f.source.quote) source.title = `“${f.source.quote}”`;
    const actions = el("span", null, "actions");
    actions.append(button("History", "memory-history-button", () => showHistory(tenant, f.id)));
    if (canAct) {
      actions.append(
        " ",
        button("Correct", "memory-correct", async () => {
          const text = window.prompt(`Corrected text of ${f.id}`, f.text);
          if (text === null) return;
          const reason = window.prompt("Why? (kept with the change)");
          if (reason === null) return;
          await write("memory/correct", { tenant, id: f.id, text, reason }, `Corrected ${f.id}.`);
        }),
        " ",
        button("Delete", "memory-forget", async () => {
          const reason = window.prompt(`Why delete ${f.id}? (kept with the change)`);
          if (reason === null) return;
          await write("memory/forget", { tenant, id: f.id, reason }, `Deleted ${f.id}.`);
        }),
      );
    }
    const text = f.redacted ? el("em", "withheld", "state") : el("span", f.text, "fact-text");
    return row(
      [el("code", f.id), text, source, f.confidence, when(f.created_at), when(f.updated_at), f.links.join(", "), actions],
      { "data-testid": "memory-fact-row", "data-id": f.id },
    );
  }

  async function showHistory(tenant, id) {
    try {
      const data = await call("GET", `memory/fact${memoryQuery({ tenant, id })}`);
      $("memory-history-title").textContent = `History of ${id}`;
      $("memory-history-list").replaceChildren(
        ...data.changes.map((c) => {
          const by = c.agent ? `${c.actor} (agent ${c.agent}, run ${c.run_id})` : c.actor;
          const item = el("li", `${when(c.at)} · ${c.op} by ${by}${c.reason ? `: ${c.reason}` : ""}`);
          item.dataset.testid = "memory-change";
          return item;
        }),
      );
      $("memory-history").hidden = false;
    } catch (err) {
      say(err.message, true);
    }
  }

  $("memory-connect").addEventListener("submit", async (event) => {
    event.preventDefault();
    const form = $("memory-connect").elements;
    const body = { agent: form.namedItem("agent").value.trim(), project: form.namedItem("project").value.trim() };
    if (await write("memory/connect", body, `Connected ${body.agent} to ${body.project}.`)) {
      form.namedItem("agent").value = "";
      form.namedItem("project").value = "";
    }
  });

  /* ---------- review ---------- */

  let reviewed = null; // the sampled run shown: {session, run_id}

  async function showRun(sample, redacted) {
    reviewed = { session: sample.session, run_id: sample.run_id };
    $("review-detail").hidden = false;
    $("review-run").textContent = sample.run_id;
    const form = $("review-form").elements;
    form.namedItem("verdict").value = sample.verdict ? sample.verdict.verdict : "pass";
    form.namedItem("note").value = sample.verdict ? sample.verdict.note : "";
    const link = $("review-case");
    link.hidden = redacted || !canAct;
    link.href = `${API}review/case?session=${encodeURIComponent(sample.session)}&run=${encodeURIComponent(sample.run_id)}`;
    const data = await call("GET", `review/transcript?session=${encodeURIComponent(sample.session)}`);
    $("review-transcript").replaceChildren(...data.transcript.map(transcriptLine));
  }

  async function loadReview() {
    const data = await call("GET", "review");
    $("review-empty").hidden = data.samples.length > 0;
    $("review-redacted").hidden = !data.redacted;
    $("review-body").replaceChildren(
      ...data.samples.map((s) => {
        const verdict = s.verdict ? `${s.verdict.verdict}${s.verdict.note ? `: ${s.verdict.note}` : ""}` : "to review";
        const open = button("Open", "review-open", () => showRun(s, data.redacted).catch((err) => say(err.message, true)));
        return row([el("code", s.run_id), el("code", s.session), s.agent, s.channel, when(s.at), s.steps, s.tools.join(", "), verdict, open],
          { "data-testid": "review-row" });
      }),
    );
  }

  $("review-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!reviewed) return;
    const form = $("review-form").elements;
    const body = { session: reviewed.session, run: reviewed.run_id, verdict: form.namedItem("verdict").value,
      note: form.namedItem("note").value.trim() };
    await write("review/verdict", body, `Verdict saved: ${body.verdict}.`);
  });

  const loaders = { sessions: loadSessions, approvals: async () => {}, dead: loadDead, effects: loadEffects, agents: async () => { await loadAgents(); await loadDrafts(); }, usage: loadUsage, access: loadAccess,
    budgets: loadBudgets, people: loadPeople, schedules: loadSchedules, memory: loadMemory, review: loadReview };

  async function refresh() {
    if (busy) {
      again = true; // e.g. a tab opened while the last one was still loading: load it once this one is done
      return;
    }
    busy = true;
    try {
      await loadApprovals(); // the count in the tab bar is always current
      if (tab !== "sessions" || !live) await loaders[tab]();
    } catch (err) {
      if (err.message !== "signed out") say(err.message, true);
    } finally {
      busy = false;
      if (again) {
        again = false;
        refresh();
      }
    }
  }

  function show(name) {
    tab = name;
    for (const b of document.querySelectorAll(".tabs button")) {
      if (b.dataset.tab === name) b.setAttribute("aria-current", "page");
      else b.removeAttribute("aria-current");
    }
    for (const panel of document.querySelectorAll("[data-panel]")) panel.hidden = panel.dataset.panel !== name;
    say("", false);
    refresh();
  }

  for (const b of document.querySelectorAll(".tabs button")) b.addEventListener("click", () => show(b.dataset.tab));

  $("signout").addEventListener("click", async () => {
    if (stream) stream.close();
    try {
      await call("POST", "logout");
    } catch (_) {
      /* signed out either way */
    }
    window.location.assign("/console/login");
  });

  async function start() {
    try {
      const me = await call("GET", "me");
      csrf = me.csrf;
      $("operator").textContent = `${me.operator} (${me.role}; ${me.tenants.join(", ")})`;
      canAct = me.role !== "viewer";
      if (!canAct) for (const node of document.querySelectorAll("#takeover, #handback, #say-form, form.write")) node.hidden = true;
      $("people-link").elements.namedItem("tenant").value = me.tenants.find((t) => t !== "*") || "";
    } catch (err) {
      if (err.message !== "signed out") say(err.message, true);
      return;
    }
    try {
      const data = await call("GET", "sessions");
      for (const state of data.states) $("filters").elements.namedItem("state").appendChild(el("option", state));
    } catch (err) {
      say(err.message, true);
    }
    show(tab); // the tab the operator may have picked while the console was loading, not always sessions
    connect();
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && !live) refresh();
    });
    setInterval(() => {
      if (!document.hidden && (tab === "budgets" || tab === "people" || tab === "schedules")) refresh();
    }, PANEL_MS);
  }

  start();
  window.addEventListener("beforeunload", () => {
    if (stream) stream.close();
    if (timer !== null) clearInterval(timer);
  });
})();
