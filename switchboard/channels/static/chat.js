/*
 * Switchboard web chat page. Plain JavaScript, no build step.
 *
 * Speaks the public API of DESIGN §10: POST api/chat/sessions, POST api/chat/messages, GET api/chat/stream (SSE).
 * Everything the model writes is rendered by building DOM nodes from a small Markdown subset; no string from the
 * server is ever parsed as HTML.
 */
"use strict";

(() => {
  const STORAGE_KEY = "switchboard.webchat";
  const MAX_TEXT_BYTES = 32 * 1024;
  const SEND_ATTEMPTS = 8;

  const list = document.getElementById("message-list");
  const scroller = document.getElementById("conversation");
  const typing = document.getElementById("typing-indicator");
  const form = document.getElementById("composer");
  const input = document.getElementById("composer-input");
  const sendButton = document.getElementById("send-button");
  const stopButton = document.getElementById("stop-button");
  const connection = document.getElementById("connection");
  const newChat = document.getElementById("new-chat");

  /* ---------- state ---------- */

  let auth = loadAuth(); // {token, session} or null
  let source = null; // EventSource
  let reconnectTimer = null;
  let reconnectDelay = 1000;
  let generation = 0; // bumps on a new session, so late events of the old one are ignored
  let seen = new Set(); // stream entry ids already applied
  let users = new Map(); // message_id -> user turn
  let pending = new Map(); // client_id -> user turn (sent, id not yet known)
  let replies = new Map(); // reply_to -> assistant bubble
  let order = []; // user turns in the order the gateway accepted them
  let running = false;

  function loadAuth() {
    try {
      const value = JSON.parse(localStorage.getItem(STORAGE_KEY) || "null");
      return value && typeof value.token === "string" ? value : null;
    } catch (_) {
      return null;
    }
  }

  function saveAuth(value) {
    auth = value;
    try {
      if (value) localStorage.setItem(STORAGE_KEY, JSON.stringify(value));
      else localStorage.removeItem(STORAGE_KEY);
    } catch (_) {
      /* private mode: the chat still works until the tab closes */
    }
  }

  function uuid() {
    if (window.crypto && typeof crypto.randomUUID === "function") return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16)); // randomUUID needs a secure context; this does not
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  /* ---------- safe Markdown subset → DOM ---------- */

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function safeHref(url) {
    const value = url.trim();
    if (!/^https?:\/\/[^\s]+$/i.test(value)) return null;
    try {
      const parsed = new URL(value);
      return parsed.protocol === "http:" || parsed.protocol === "https:" ? parsed.href : null;
    } catch (_) {
      return null;
    }
  }

  const ESCAPABLE = "\\`*_[]()#+-.!>";

  function renderInline(text, parent) {
    let buffer = "";
    const flush = () => {
      if (buffer) parent.appendChild(document.createTextNode(buffer));
      buffer = "";
    };
    let i = 0;
    while (i < text.length) {
      const ch = text[i];
      if (ch === "\\" && i + 1 < text.length && ESCAPABLE.includes(text[i + 1])) {
        buffer += text[i + 1];
        i += 2;
        continue;
      }
      if (ch === "`") {
        const end = text.indexOf("`", i + 1);
        if (end > i + 1) {
          flush();
          parent.appendChild(el("code", "", text.slice(i + 1, end)));
          i = end + 1;
          continue;
        }
      }
      if ((ch === "*" || ch === "_") && text[i + 1] === ch) {
        const delim = ch + ch;
        const end = text.indexOf(delim, i + 2);
        if (end > i + 2 && text[i + 2] !== " ") {
          flush();
          const strong = el("strong");
          renderInline(text.slice(i + 2, end), strong);
          parent.appendChild(strong);
          i = end + 2;
          continue;
        }
      }
      if (ch === "*" || ch === "_") {
        const before = i > 0 ? text[i - 1] : " ";
        const wordInside = ch === "_" && /[\p{L}\p{N}]/u.test(before); // snake_case stays as it is
        const end = text.indexOf(ch, i + 1);
        if (!wordInside && end > i + 1 && text[i + 1] !== " " && text[end - 1] !== " ") {
          flush();
          const em = el("em");
          renderInline(text.slice(i + 1, end), em);
          parent.appendChild(em);
          i = end + 1;
          continue;
        }
      }
      if (ch === "[") {
        const match = /^\[([^\]\n]+)\]\(([^)\s]+)\)/.exec(text.slice(i));
        const href = match && safeHref(match[2]);
        if (match && href) {
          flush();
          const a = el("a");
          a.href = href;
          a.rel = "noopener noreferrer nofollow";
          a.target = "_blank";
          renderInline(match[1], a);
          parent.appendChild(a);
          i += match[0].length;
          continue;
        }
      }
      buffer += ch;
      i += 1;
    }
    flush();
  }

  function renderMarkdown(text, container) {
    container.textContent = "";
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let paragraph = [];
    const endParagraph = () => {
      if (!paragraph.length) return;
      const p = el("p");
      paragraph.forEach((line, index) => {
        if (index) p.appendChild(el("br"));
        renderInline(line, p);
      });
      container.appendChild(p);
      paragraph = [];
    };
    const bullet = /^\s{0,3}[-*+]\s+(.*)$/;
    const numbered = /^\s{0,3}\d{1,9}[.)]\s+(.*)$/;
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (/^\s{0,3}```/.test(line)) {
        endParagraph();
        const code = [];
        i += 1;
        while (i < lines.length && !/^\s{0,3}```\s*$/.test(lines[i])) code.push(lines[i++]);
        i += 1; // the closing fence (or the end of a reply still streaming)
        const pre = el("pre");
        pre.appendChild(el("code", "", code.join("\n")));
        container.appendChild(pre);
        continue;
      }
      const kind = bullet.test(line) ? bullet : numbered.test(line) ? numbered : null;
      if (kind) {
        endParagraph();
        const listNode = el(kind === bullet ? "ul" : "ol");
        while (i < lines.length && kind.test(lines[i])) {
          const li = el("li");
          renderInline(kind.exec(lines[i])[1], li);
          listNode.appendChild(li);
          i += 1;
        }
        container.appendChild(listNode);
        continue;
      }
      const heading = /^\s{0,3}#{1,6}\s+(.*)$/.exec(line);
      if (heading) {
        endParagraph();
        const p = el("p");
        const strong = el("strong");
        renderInline(heading[1], strong);
        p.appendChild(strong);
        container.appendChild(p);
      } else if (!line.trim()) {
        endParagraph();
      } else {
        paragraph.push(line);
      }
      i += 1;
    }
    endParagraph();
  }

  /* ---------- the message list ---------- */

  function nearBottom() {
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 80;
  }

  function keepScrolled(wasNear) {
    if (wasNear) scroller.scrollTop = scroller.scrollHeight;
  }

  function setStatus(turn, state, label) {
    turn.state = state;
    turn.statusEl.textContent = label === undefined ? state : label;
    turn.li.dataset.state = state;
  }

  function userTurn(text, clientId) {
    const li = el("li", "msg msg-user");
    li.dataset.testid = "msg-user";
    const body = el("div", "body", text);
    const statusEl = el("span", "msg-status");
    statusEl.dataset.testid = "msg-status";
    li.append(body, statusEl);
    const turn = { li, statusEl, state: "", clientId, messageId: null, last: li };
    const wasNear = nearBottom();
    list.appendChild(li);
    keepScrolled(wasNear);
    return turn;
  }

  function assistantBubble(replyTo) {
    let bubble = replies.get(replyTo);
    if (bubble) return bubble;
    const li = el("li", "msg msg-assistant");
    li.dataset.testid = "msg-assistant";
    if (replyTo) li.dataset.replyTo = replyTo;
    li.setAttribute("aria-busy", "true");
    const body = el("div", "body");
    li.appendChild(body);
    bubble = { li, body, text: "", final: false, failed: false, frame: 0 };
    replies.set(replyTo, bubble);
    const wasNear = nearBottom();
    const turn = users.get(replyTo);
    if (turn && turn.last.parentNode === list) {
      turn.last.after(li); // under the message it answers, even if later messages were sent meanwhile
      turn.last = li;
    } else {
      list.appendChild(li);
    }
    keepScrolled(wasNear);
    return bubble;
  }

  function paint(bubble) {
    if (bubble.frame) return;
    bubble.frame = requestAnimationFrame(() => {
      bubble.frame = 0;
      const wasNear = nearBottom();
      renderMarkdown(bubble.text, bubble.body);
      keepScrolled(wasNear);
    });
  }

  function clearError(bubble) {
    const old = bubble.li.querySelector(".msg-error");
    if (old) old.remove();
    bubble.failed = false;
  }

  function started(messageId) {
    // FIFO: a run for message X means every message accepted before X has started too.
    for (const turn of order) {
      if (turn.state === "queued" || turn.state === "sent") setStatus(turn, "", "");
      if (turn.messageId === messageId) break;
    }
  }

  function startOldest() {
    const turn = order.find((t) => t.state === "queued" || t.state === "sent");
    if (turn) setStatus(turn, "", "");
  }

  function setRunning(value) {
    running = value;
    typing.hidden = !value;
  }

  /* ---------- stream events ---------- */

  function applyEvent(type, id, data) {
    if (seen.has(id)) return;
    seen.add(id);
    if (type === "user") onUser(data);
    else if (type === "status") onStatus(data);
    else if (type === "delta") onDelta(data);
    else if (type === "message") onMessage(data);
    else if (type === "error") onError(data);
  }

  function onUser(data) {
    if (!data || typeof data.message_id !== "string") return;
    let turn = users.get(data.message_id);
    if (!turn && data.client_id && pending.has(data.client_id)) turn = pending.get(data.client_id);
    if (!turn) turn = userTurn(typeof data.text === "string" ? data.text : "", data.client_id);
    if (turn.clientId) pending.delete(turn.clientId);
    turn.messageId = data.message_id;
    users.set(data.message_id, turn);
    // The stream, not the order of HTTP answers, says in which order the gateway accepted messages.
    if (!order.includes(turn)) order.push(turn);
    if (!replies.has(data.message_id) && (turn.state === "sending" || turn.state === "")) setStatus(turn, "queued");
  }

  function onStatus(data) {
    const status = data && data.status;
    if (status === "running") {
      if (typeof data.reply_to === "string" && data.reply_to) {
        started(data.reply_to);
        const bubble = replies.get(data.reply_to);
        if (bubble && !bubble.final) {
          bubble.text = ""; // a new attempt streams the reply again from the start
          paint(bubble);
        }
      } else {
        startOldest();
      }
      setRunning(true);
    } else if (status === "idle") {
      for (const turn of order) if (turn.state === "queued") setStatus(turn, "", "");
      setRunning(false);
    }
  }

  function onDelta(data) {
    if (!data || typeof data.text !== "string") return;
    const replyTo = data.reply_to || "";
    if (replyTo) started(replyTo);
    const bubble = assistantBubble(replyTo);
    if (bubble.final) return;
    if (bubble.failed) {
      clearError(bubble); // a retry after an error streams a fresh reply
      bubble.text = "";
    }
    bubble.li.classList.add("streaming");
    bubble.text += data.text;
    paint(bubble);
  }

  function onMessage(data) {
    if (!data || typeof data.text !== "string") return;
    const replyTo = data.reply_to || "";
    if (replyTo) started(replyTo);
    const bubble = assistantBubble(replyTo);
    clearError(bubble);
    bubble.text = data.text;
    bubble.final = true;
    bubble.li.classList.remove("streaming");
    bubble.li.setAttribute("aria-busy", "false");
    paint(bubble);
    if (!order.some((t) => t.state === "queued")) setRunning(false); // the next run, if any, says "running"
  }

  function onError(data) {
    if (!data) return;
    const replyTo = data.reply_to || "";
    if (replyTo) started(replyTo);
    const bubble = assistantBubble(replyTo);
    if (bubble.final) return;
    clearError(bubble);
    bubble.failed = true;
    bubble.li.classList.remove("streaming");
    bubble.li.setAttribute("aria-busy", "false");
    const note = el("p", "msg-error", String(data.message || "The reply failed."));
    note.dataset.testid = "msg-error";
    note.setAttribute("role", "alert");
    if (data.code) note.title = String(data.code);
    bubble.li.appendChild(note);
  }

  /* ---------- the SSE connection ---------- */

  function streamUrl() {
    return `api/chat/stream?token=${encodeURIComponent(auth.token)}`;
  }

  function connect() {
    clearTimeout(reconnectTimer);
    if (source) source.close();
    const mine = generation;
    source = new EventSource(streamUrl());
    connection.textContent = "Connecting…";
    source.onopen = () => {
      connection.textContent = "Connected";
      reconnectDelay = 1000;
    };
    for (const type of ["user", "status", "delta", "message", "error"]) {
      source.addEventListener(type, (event) => {
        if (mine !== generation) return;
        let data;
        try {
          data = JSON.parse(event.data);
        } catch (_) {
          return;
        }
        applyEvent(type, event.lastEventId, data);
      });
    }
    source.onerror = () => {
      if (mine !== generation) return;
      connection.textContent = "Reconnecting…";
      // A live connection that dropped is retried by the browser with Last-Event-ID. A refused one
      // (401, 503) closes for good: find out why, then start over (events already shown are skipped by id).
      if (source.readyState === EventSource.CLOSED) {
        reconnectTimer = setTimeout(recover, reconnectDelay);
        reconnectDelay = Math.min(reconnectDelay * 2, 30000);
      }
    };
  }

  async function recover() {
    const mine = generation;
    try {
      const controller = new AbortController();
      const response = await fetch(streamUrl(), { signal: controller.signal, cache: "no-store" });
      controller.abort();
      if (mine !== generation) return;
      if (response.status === 401) {
        await startOver();
        return;
      }
    } catch (_) {
      /* offline or aborted: try the stream again anyway */
    }
    if (mine === generation) connect();
  }

  /* ---------- sessions and sending ---------- */

  async function createSession() {
    for (let attempt = 0; ; attempt += 1) {
      try {
        const response = await fetch("api/chat/sessions", {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: "{}",
        });
        if (response.status === 201) {
          const body = await response.json();
          saveAuth({ token: body.token, session: body.session });
          return;
        }
      } catch (_) {
        /* network error: retry below */
      }
      connection.textContent = "Cannot reach the server; retrying…";
      await sleep(Math.min(1000 * 2 ** attempt, 30000));
    }
  }

  function resetView() {
    generation += 1;
    if (source) source.close();
    source = null;
    seen = new Set();
    users = new Map();
    pending = new Map();
    replies = new Map();
    order = [];
    list.textContent = "";
    setRunning(false);
  }

  async function startOver() {
    resetView();
    saveAuth(null);
    await createSession();
    connect();
  }

  function showSendError(turn, message, retryable) {
    setStatus(turn, "failed", "not sent");
    const old = turn.li.querySelector(".msg-error");
    if (old) old.remove();
    const note = el("p", "msg-error", message);
    note.dataset.testid = "msg-error";
    note.setAttribute("role", "alert");
    if (retryable) {
      const retry = el("button", "retry", "Retry");
      retry.type = "button";
      retry.addEventListener("click", () => {
        note.remove();
        deliver(turn, turn.text);
      });
      note.append(" ", retry);
    }
    turn.li.appendChild(note);
  }

  async function deliver(turn, text) {
    setStatus(turn, "sending", "sending…");
    const mine = generation;
    for (let attempt = 0; attempt < SEND_ATTEMPTS; attempt += 1) {
      let response = null;
      try {
        response = await fetch("api/chat/messages", {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${auth.token}` },
          // The same client_id on every retry: the gateway keeps one message however often it arrives.
          body: JSON.stringify({ text, client_id: turn.clientId }),
        });
      } catch (_) {
        response = null; // network error: retry
      }
      if (mine !== generation) return;
      if (response && response.status === 202) {
        const body = await response.json();
        if (!turn.messageId) {
          turn.messageId = body.message_id;
          pending.delete(turn.clientId);
          if (!users.has(body.message_id)) users.set(body.message_id, turn);
        }
        if (turn.state === "sending") setStatus(turn, replies.has(body.message_id) ? "" : "queued");
        return;
      }
      if (response && response.status === 401) {
        await startOver();
        showSendError(userTurn(text, turn.clientId), "Your chat session expired; send it again.", false);
        return;
      }
      if (response && response.status >= 400 && response.status < 500) {
        let message = `The message was refused (${response.status}).`;
        try {
          const body = await response.json();
          if (body && body.error && body.error.message) message = body.error.message;
        } catch (_) {
          /* not JSON */
        }
        showSendError(turn, message, false);
        return;
      }
      await sleep(Math.min(500 * 2 ** attempt, 15000));
    }
    showSendError(turn, "Could not reach the server.", true);
  }

  function send(text) {
    if (new TextEncoder().encode(text).length > MAX_TEXT_BYTES) {
      const turn = userTurn(text, uuid());
      showSendError(turn, "This message is over 32 KiB; shorten it.", false);
      return;
    }
    const turn = userTurn(text, uuid());
    turn.text = text;
    pending.set(turn.clientId, turn);
    deliver(turn, text);
  }

  /* ---------- wiring ---------- */

  function autosize() {
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight, 160)}px`;
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value;
    if (!text.trim() || !auth) return;
    input.value = "";
    autosize();
    send(text);
    input.focus();
  });

  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit(sendButton);
    }
  });
  input.addEventListener("input", autosize);

  // "/stop" stops the reply being written (the model request and its tools); queued messages still run.
  stopButton.addEventListener("click", () => {
    if (running && auth) send("/stop");
  });

  newChat.addEventListener("click", () => {
    startOver();
    input.focus();
  });

  async function start() {
    if (!auth) await createSession();
    connect();
  }

  start();
})();
