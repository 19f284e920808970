/*
 * Switchboard web chat page. Plain JavaScript, no build step.
 *
 * Speaks the web chat's public API: POST api/chat/sessions, POST api/chat/uploads (one file each, before the message
 * naming them), POST api/chat/messages, POST api/chat/stream-ticket and GET api/chat/stream (SSE, opened with a
 * single-use ticket so the bearer token never appears in a URL).
 * Everything the model writes is rendered by building DOM nodes from a small Markdown subset; no string from the
 * server is ever parsed as HTML.
 */
"use strict";

(() => {
  const STORAGE_KEY = "switchboard.webchat";
  const MAX_TEXT_BYTES = 32 * 1024;
  const SEND_ATTEMPTS = 8;
  const MAX_FILES = 10; // the gateway may allow fewer (SWITCHBOARD_ATTACHMENTS__MAX_COUNT): it says so in a 400

  const list = document.getElementById("message-list");
  const scroller = document.getElementById("conversation");
  const typing = document.getElementById("typing-indicator");
  const form = document.getElementById("composer");
  const input = document.getElementById("composer-input");
  const sendButton = document.getElementById("send-button");
  const stopButton = document.getElementById("stop-button");
  const connection = document.getElementById("connection");
  const newChat = document.getElementById("new-chat");
  const app = document.querySelector(".app");
  const fileInput = document.getElementById("file-input");
  const attachButton = document.getElementById("attach-button");
  const chosenList = document.getElementById("chosen-files");
  const attachError = document.getElementById("attach-error");
  const emptyState = document.getElementById("empty-state");
  const emptyName = document.getElementById("empty-name");
  const emptyDescription = document.getElementById("empty-description");
  const emptyHint = emptyState.querySelector(".empty-hint");
  const startersRow = document.getElementById("starters");

  /* ---------- state ---------- */

  let auth = loadAuth(); // {token, session, agent} or null
  let source = null; // EventSource
  let reconnectTimer = null;
  let reconnectDelay = 1000;
  let lastEventId = ""; // the newest stream entry id received: a fresh connection resumes after it
  let attempt = 0; // bumps on every connect(), so an older attempt still waiting for its ticket gives up
  let generation = 0; // bumps on a new session, so late events of the old one are ignored
  let seen = new Set(); // stream entry ids already applied
  let users = new Map(); // message_id -> user turn
  let pending = new Map(); // client_id -> user turn (sent, id not yet known)
  let replies = new Map(); // reply_to -> assistant bubble
  let order = []; // user turns in the order the gateway accepted them
  let tools = new Map(); // call_id -> tool card
  let offers = new Map(); // option id -> the offer showing it ({buttons, outcome})
  let settledEarly = new Map(); // option id -> a choices_settled that came before its offer
  let notices = new Set(); // system lines shown ("reply_to|text"), so a notice is never shown twice
  const stopIds = new Set(); // client_ids of the stops this page posted
  let running = false;
  let chosen = []; // File objects picked or dropped, sent with the next message

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

  /* ---------- icons: inline SVG, so nothing needs an emoji font ---------- */

  const ICONS = {
    attach: "M21 11.5l-8.6 8.6a5 5 0 0 1-7.1-7.1l8.6-8.6a3.3 3.3 0 0 1 4.7 4.7l-8.6 8.6a1.7 1.7 0 0 1-2.4-2.4l7.9-7.9",
    send: "M12 19V5M5 12l7-7 7 7",
    stop: "M7 7h10v10H7z",
    file: "M14 3H7a2 2 0 0 0-2 2v14a2 2 0 0 0 2 2h10a2 2 0 0 0 2-2V8zM14 3v5h5",
    tool: "M4 17l6-6-6-6M12 19h8",
    check: "M5 12.5l4.5 4.5L19 7.5",
    x: "M6 6l12 12M18 6L6 18",
    spinner: "M12 3a9 9 0 1 0 9 9",
    clock: "M12 3a9 9 0 1 1 0 18a9 9 0 1 1 0-18M12 7v5l3 2",
    ban: "M12 3a9 9 0 1 1 0 18a9 9 0 1 1 0-18M5.6 5.6l12.8 12.8",
    download: "M12 4v11M7 10l5 5 5-5M5 20h14",
    chevron: "M9 6l6 6-6 6",
  };

  function icon(name) {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 24 24");
    svg.setAttribute("class", `icon icon-${name}`);
    svg.setAttribute("aria-hidden", "true");
    svg.setAttribute("focusable", "false");
    const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
    path.setAttribute("d", ICONS[name]);
    svg.appendChild(path);
    return svg;
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

  /* Block level: paragraphs, fenced code, headings, block quotes, tables, nested lists. Each block element gets
   * dir="auto", so a right-to-left paragraph reads right to left whatever the page's direction. */

  const FENCE = /^\s{0,3}```/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)(?:\s+#+\s*)?$/;
  const QUOTE = /^\s{0,3}>\s?(.*)$/;
  const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
  const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

  function block(tag, className) {
    const node = el(tag, className);
    node.dir = "auto";
    return node;
  }

  function indentOf(line) {
    return line.length - line.trimStart().length;
  }

  function tableCells(line) {
    let text = line.trim();
    if (text.startsWith("|")) text = text.slice(1);
    if (text.endsWith("|") && !text.endsWith("\\|")) text = text.slice(0, -1);
    const cells = [];
    let cell = "";
    for (let i = 0; i < text.length; i += 1) {
      if (text[i] === "\\" && text[i + 1] === "|") {
        cell += "|";
        i += 1;
      } else if (text[i] === "|") {
        cells.push(cell.trim());
        cell = "";
      } else {
        cell += text[i];
      }
    }
    cells.push(cell.trim());
    return cells;
  }

  function isTableStart(lines, i) {
    return lines[i].includes("|") && i + 1 < lines.length && lines[i + 1].includes("-") && TABLE_RULE.test(lines[i + 1]);
  }

  function renderTable(lines, i, container) {
    const head = tableCells(lines[i]);
    const aligns = tableCells(lines[i + 1]).map((rule) => {
      const left = rule.startsWith(":");
      const right = rule.endsWith(":");
      return left && right ? "center" : right ? "right" : left ? "left" : "";
    });
    const table = el("table");
    const row = (cells, tag, parent) => {
      const tr = el("tr");
      head.forEach((_, column) => {
        const cell = block(tag);
        if (aligns[column]) cell.style.textAlign = aligns[column];
        renderInline(cells[column] || "", cell);
        tr.appendChild(cell);
      });
      parent.appendChild(tr);
    };
    const thead = el("thead");
    row(head, "th", thead);
    table.appendChild(thead);
    const tbody = el("tbody");
    i += 2;
    while (i < lines.length && lines[i].trim() && lines[i].includes("|")) row(tableCells(lines[i++]), "td", tbody);
    if (tbody.childNodes.length) table.appendChild(tbody);
    const scroll = el("div", "table-scroll");
    scroll.appendChild(table);
    container.appendChild(scroll);
    return i;
  }

  function renderList(lines, i, container) {
    const first = ITEM.exec(lines[i]);
    const base = first[1].length;
    const ordered = /\d/.test(first[2]);
    const listNode = block(ordered ? "ol" : "ul");
    if (ordered && parseInt(first[2], 10) !== 1) listNode.start = parseInt(first[2], 10);
    let item = null;
    let children = [];
    const endItem = () => {
      if (item && children.some((line) => line.trim())) {
        const depth = Math.min(...children.filter((line) => line.trim()).map(indentOf));
        renderBlocks(
          children.map((line) => line.slice(Math.min(depth, indentOf(line)))),
          item,
        );
      }
      children = [];
    };
    while (i < lines.length) {
      const line = lines[i];
      const match = ITEM.exec(line);
      if (match && match[1].length <= base + 1) {
        if (/\d/.test(match[2]) !== ordered) break; // another kind of list starts here
        endItem();
        item = block("li");
        renderInline(match[3], item);
        listNode.appendChild(item);
        i += 1;
        continue;
      }
      if (line.trim() && indentOf(line) > base) {
        children.push(line); // a nested list or a continuation of the item
        i += 1;
        continue;
      }
      if (!line.trim()) {
        let next = i + 1;
        while (next < lines.length && !lines[next].trim()) next += 1;
        const more = next < lines.length && (indentOf(lines[next]) > base || ITEM.test(lines[next]));
        const sameList = more && (indentOf(lines[next]) > base || /\d/.test(ITEM.exec(lines[next])[2]) === ordered);
        if (!sameList) break;
        children.push("");
        i += 1;
        continue;
      }
      break;
    }
    endItem();
    container.appendChild(listNode);
    return i;
  }

  function renderBlocks(lines, container) {
    let paragraph = [];
    const endParagraph = () => {
      if (!paragraph.length) return;
      const p = block("p");
      paragraph.forEach((line, index) => {
        if (index) p.appendChild(el("br"));
        renderInline(line.trim(), p);
      });
      container.appendChild(p);
      paragraph = [];
    };
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (FENCE.test(line)) {
        endParagraph();
        const code = [];
        i += 1;
        while (i < lines.length && !/^\s{0,3}```\s*$/.test(lines[i])) code.push(lines[i++]);
        i += 1; // the closing fence (or the end of a reply still streaming)
        const pre = el("pre");
        pre.dir = "ltr";
        pre.appendChild(el("code", "", code.join("\n")));
        container.appendChild(pre);
        continue;
      }
      const heading = HEADING.exec(line);
      if (heading) {
        endParagraph();
        const h = block(`h${heading[1].length}`);
        renderInline(heading[2], h);
        container.appendChild(h);
        i += 1;
        continue;
      }
      if (QUOTE.test(line)) {
        endParagraph();
        const quoted = [];
        while (i < lines.length && QUOTE.test(lines[i])) quoted.push(QUOTE.exec(lines[i++])[1]);
        const quote = block("blockquote");
        renderBlocks(quoted, quote);
        container.appendChild(quote);
        continue;
      }
      if (isTableStart(lines, i)) {
        endParagraph();
        i = renderTable(lines, i, container);
        continue;
      }
      if (ITEM.test(line)) {
        endParagraph();
        i = renderList(lines, i, container);
        continue;
      }
      if (!line.trim()) {
        endParagraph();
      } else {
        paragraph.push(line);
      }
      i += 1;
    }
    endParagraph();
  }

  function renderMarkdown(text, container) {
    container.textContent = "";
    renderBlocks(String(text).replace(/\r\n?/g, "\n").replace(/\t/g, "    ").split("\n"), container);
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

  function sizeLabel(bytes) {
    if (bytes < 1024) return `${bytes} B`;
    if (bytes < 10 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
    if (bytes < 1024 * 1024) return `${Math.round(bytes / 1024)} KB`;
    return `${(bytes / (1024 * 1024)).toFixed(1)} MB`;
  }

  // The names of the files a message carries ([{name, size}]), under its text.
  function fileList(files) {
    const ul = el("ul", "msg-files");
    ul.dataset.testid = "msg-files";
    ul.setAttribute("aria-label", "Attached files");
    for (const file of files) {
      if (!file || typeof file.name !== "string") continue;
      const size = typeof file.size === "number" ? ` (${sizeLabel(file.size)})` : "";
      const li = el("li");
      li.append(icon("file"), `${file.name}${size}`);
      ul.appendChild(li);
    }
    return ul;
  }

  function userTurn(text, clientId, files) {
    const li = el("li", "msg msg-user");
    li.dataset.testid = "msg-user";
    li.dir = "auto";
    const body = el("div", "body", text);
    const statusEl = el("span", "msg-status");
    statusEl.dataset.testid = "msg-status";
    li.append(body);
    if (files && files.length) li.append(fileList(files));
    li.append(statusEl);
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
    li.dir = "auto";
    if (replyTo) li.dataset.replyTo = replyTo;
    li.setAttribute("aria-busy", "true");
    const body = el("div", "body");
    li.appendChild(body);
    bubble = { li, body, text: "", final: false, failed: false, frame: 0, work: null };
    replies.set(replyTo, bubble);
    place(replyTo, li);
    return bubble;
  }

  // Put a new list item under the message it answers (and what already answers it), even if later messages were
  // sent meanwhile; at the end when that message is not shown.
  function place(replyTo, li) {
    const wasNear = nearBottom();
    const turn = users.get(replyTo);
    const bubble = replies.get(replyTo);
    if (turn && turn.last.parentNode === list) {
      turn.last.after(li);
      turn.last = li;
    } else if (bubble && bubble.li !== li && bubble.li.parentNode === list) {
      bubble.li.after(li);
    } else {
      list.appendChild(li);
    }
    keepScrolled(wasNear);
  }

  // The part of a reply above its answer that shows the agent's work: tool cards and files, in the order they came.
  function workOf(bubble) {
    if (!bubble.work) {
      bubble.work = el("div", "work");
      bubble.li.insertBefore(bubble.work, bubble.body);
      bubble.li.classList.add("has-work");
    }
    return bubble.work;
  }

  // A small centred line for what is not a message: a stopped reply, a notice from the gateway.
  function systemLine(replyTo, text, code) {
    const key = `${replyTo}|${text}`;
    if (notices.has(key)) return;
    notices.add(key);
    const li = el("li", "system-line", text);
    li.dataset.testid = "system-line";
    if (code) li.title = code;
    const bubble = replies.get(replyTo);
    const turn = users.get(replyTo);
    if (bubble && !bubble.text && !bubble.work && bubble.li.parentNode === list) {
      bubble.li.replaceWith(li); // an answer that never started: the line takes its place
      if (turn && turn.last === bubble.li) turn.last = li;
      replies.delete(replyTo);
      return;
    }
    place(replyTo, li);
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
    else if (type === "reply_error") onReplyError(data);
    else if (type === "tool") onTool(data);
    else if (type === "choices_settled") onChoicesSettled(data);
  }

  const STOP_COMMANDS = new Set(["/stop", "/cancel"]);
  const isStopText = (text) => typeof text === "string" && STOP_COMMANDS.has(text.trim().toLowerCase());

  function onUser(data) {
    if (!data || typeof data.message_id !== "string") return;
    const attached = Array.isArray(data.attachments) && data.attachments.length > 0;
    if (data.command === "stop" || stopIds.has(data.client_id) || (isStopText(data.text) && !attached)) return;
    let turn = users.get(data.message_id);
    if (!turn && data.client_id && pending.has(data.client_id)) turn = pending.get(data.client_id);
    if (!turn) {
      const files = Array.isArray(data.attachments) ? data.attachments : [];
      turn = userTurn(typeof data.text === "string" ? data.text : "", data.client_id, files);
    }
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
      stopRunningCards();
      for (const turn of order) if (turn.state === "queued") setStatus(turn, "", "");
      for (const bubble of replies.values()) {
        if (bubble.work && !bubble.text) bubble.li.setAttribute("aria-busy", "false"); // work, files, no answer
      }
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
    if (data.notice === true) {
      systemLine(replyTo, data.text);
      return;
    }
    if (replyTo) started(replyTo);
    if (data.voice === true && data.file && typeof data.file === "object") {
      renderVoice(assistantBubble(replyTo), data.file); // the answer spoken: a player under its text
      return;
    }
    if (data.file && typeof data.file === "object") {
      renderFile(assistantBubble(replyTo), data.file, data.text); // a file comes before the turn's answer
      return;
    }
    const bubble = assistantBubble(replyTo);
    clearError(bubble);
    bubble.text = data.text;
    bubble.final = true;
    bubble.li.classList.remove("streaming");
    bubble.li.setAttribute("aria-busy", "false");
    paint(bubble);
    if (Array.isArray(data.choices)) renderChoices(bubble, data.choices, data.approval);
    if (!order.some((t) => t.state === "queued")) setRunning(false); // the next run, if any, says "running"
  }

  // An offered choice: one button per option; a click posts {"choice": id} (the agent sees the option's id). An
  // approval also shows what would run and why a person must decide. A choices_settled event (a decision made here,
  // in the console or elsewhere, or an expiry) disables the buttons and says what was decided and by whom.
  function renderChoices(bubble, choices, approval) {
    for (const old of bubble.li.querySelectorAll(".choices, .approval, .choice-outcome")) old.remove();
    if (approval && typeof approval === "object") bubble.li.appendChild(approvalCard(approval));
    const row = el("div", "choices");
    row.dataset.testid = "msg-choices";
    const outcome = el("p", "choice-outcome");
    outcome.dataset.testid = "choice-outcome";
    outcome.setAttribute("role", "status");
    outcome.hidden = true;
    const offer = { buttons: [], outcome };
    for (const option of choices) {
      if (!option || typeof option.id !== "string" || typeof option.label !== "string") continue;
      const button = el("button", "choice");
      button.appendChild(el("span", "choice-label", option.label));
      button.type = "button";
      button.dataset.choice = option.id;
      button.setAttribute("aria-pressed", "false");
      button.addEventListener("click", () => {
        mark(offer, option.id);
        sendChoice(option.id, option.label);
      });
      row.appendChild(button);
      offer.buttons.push(button);
      offers.set(option.id, offer);
    }
    bubble.li.append(row, outcome);
    const early = choices.map((option) => option && settledEarly.get(option.id)).find(Boolean);
    if (early) settle(offer, early);
  }

  function mark(offer, chosenId) {
    for (const button of offer.buttons) {
      const picked = button.dataset.choice === chosenId;
      button.disabled = true;
      button.classList.toggle("picked", picked);
      button.setAttribute("aria-pressed", String(picked));
    }
  }

  function settle(offer, data) {
    mark(offer, typeof data.chosen === "string" ? data.chosen : null);
    const label = typeof data.label === "string" ? data.label : "";
    const by = typeof data.by === "string" ? data.by : "";
    offer.outcome.textContent = label && by ? `${label} by ${by}` : label;
    offer.outcome.hidden = !offer.outcome.textContent;
  }

  function onChoicesSettled(data) {
    if (!data || !Array.isArray(data.ids)) return;
    const ids = data.ids.filter((id) => typeof id === "string");
    const offer = ids.map((id) => offers.get(id)).find(Boolean);
    if (offer) settle(offer, data);
    else for (const id of ids) settledEarly.set(id, data); // the offer is not shown yet
  }

  function expiryLabel(expiresAt) {
    if (typeof expiresAt !== "number" || !Number.isFinite(expiresAt)) return "";
    const left = expiresAt * 1000 - Date.now();
    const at = new Date(expiresAt * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
    if (left <= 0) return `Expired at ${at}`;
    const minutes = Math.round(left / 60000);
    return minutes < 1 ? `Expires at ${at} (in under a minute)` : `Expires at ${at} (in ${minutes} min)`;
  }

  function approvalCard(approval) {
    const card = el("div", "approval");
    card.dataset.testid = "approval-card";
    const head = el("p", "approval-head");
    head.append(icon("tool"), el("span", "approval-tool", typeof approval.tool === "string" ? approval.tool : "tool"));
    card.appendChild(head);
    if (typeof approval.title === "string" && approval.title) {
      const title = el("code", "approval-title", approval.title);
      title.dir = "ltr";
      card.appendChild(title);
    }
    if (typeof approval.reason === "string" && approval.reason) {
      const reason = block("p", "approval-reason");
      reason.textContent = approval.reason;
      card.appendChild(reason);
    }
    const expiry = expiryLabel(approval.expires_at);
    if (expiry) card.appendChild(el("p", "approval-expiry", expiry));
    return card;
  }

  /* ---------- the agent's work: tool cards ---------- */

  const TOOL_STATES = {
    running: ["spinner", "Running"],
    ok: ["check", "Done"],
    failed: ["x", "Failed"],
    waiting_approval: ["clock", "Waiting for approval"],
    refused: ["ban", "Refused"],
    stopped: ["ban", "Stopped"], // the page's own: the run ended (a stop, a failure) before the call's end came
  };

  // A call still running when its run ended (stopped, failed, moved on) never gets its final card: say it stopped.
  function stopRunningCards() {
    for (const card of tools.values()) {
      if (card.details.dataset.state === "running") updateTool(card, { ...card.data, state: "stopped" });
    }
  }

  function durationLabel(ms) {
    if (ms < 1000) return `${Math.round(ms)} ms`;
    const seconds = ms / 1000;
    if (seconds < 60) return `${seconds.toFixed(1)} s`;
    return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  }

  // How long a running call has run, in whole seconds (the gateway's clock; a browser clock behind it reads 0 s).
  function elapsedLabel(startedAt) {
    const seconds = Math.max(0, Math.floor(Date.now() / 1000 - startedAt));
    return seconds < 60 ? `${seconds} s` : `${Math.floor(seconds / 60)} min ${seconds % 60} s`;
  }

  // One clock for every running card, ticking only while one runs.
  let clock = null;
  function startClock() {
    if (clock !== null) return;
    clock = setInterval(() => {
      let running = 0;
      for (const card of tools.values()) {
        if (card.details.dataset.state !== "running") continue;
        running += 1;
        card.meta.textContent = elapsedLabel(card.startedAt);
      }
      if (!running) {
        clearInterval(clock);
        clock = null;
      }
    }, 1000);
  }

  function toolCard() {
    const details = el("details", "tool");
    details.dataset.testid = "tool-card";
    const summary = el("summary");
    const badge = el("span", "tool-icon");
    const title = el("span", "tool-title");
    title.dir = "ltr";
    const state = el("span", "tool-state");
    const meta = el("span", "tool-meta");
    const chevron = icon("chevron");
    summary.append(badge, title, state, meta, chevron);
    const body = el("div", "tool-body");
    const args = el("pre", "tool-arguments");
    args.dataset.testid = "tool-arguments";
    args.setAttribute("aria-label", "Arguments");
    const output = el("pre", "tool-output");
    output.dataset.testid = "tool-output";
    output.setAttribute("aria-label", "Output");
    const files = el("ul", "tool-files");
    files.dataset.testid = "tool-files";
    files.setAttribute("aria-label", "Files made");
    body.append(args, output, files);
    details.append(summary, body);
    const card = { details, badge, title, state, meta, args, output, files, touched: false };
    summary.addEventListener("click", () => {
      card.touched = true; // the user's choice of open or closed wins over the default
    });
    return card;
  }

  function onTool(data) {
    if (!data || typeof data.call_id !== "string" || !data.call_id) return;
    const replyTo = data.reply_to || "";
    let card = tools.get(data.call_id);
    if (!card) {
      if (replyTo) started(replyTo);
      const bubble = assistantBubble(replyTo);
      card = toolCard();
      const wasNear = nearBottom();
      workOf(bubble).appendChild(card.details);
      keepScrolled(wasNear);
      tools.set(data.call_id, card);
    }
    updateTool(card, data);
  }

  function updateTool(card, data) {
    card.data = data;
    const state = Object.hasOwn(TOOL_STATES, data.state) ? data.state : "running";
    const [iconName, label] = TOOL_STATES[state];
    card.details.dataset.state = state;
    card.details.setAttribute("aria-busy", String(state === "running"));
    card.badge.replaceChildren(icon(iconName));
    const title = typeof data.title === "string" && data.title ? data.title : String(data.tool || "tool");
    card.title.textContent = title;
    card.title.title = title;
    card.state.textContent = label;
    const meta = [];
    if (typeof data.exit_status === "number") meta.push(`exit ${data.exit_status}`);
    if (typeof data.duration_ms === "number") meta.push(durationLabel(data.duration_ms));
    card.startedAt = typeof data.started_at === "number" ? data.started_at : Date.now() / 1000;
    if (state === "running") {
      meta.push(elapsedLabel(card.startedAt));
      startClock();
    }
    card.meta.textContent = meta.join(" · ");
    card.meta.hidden = !meta.length;

    let args = typeof data.arguments === "string" ? data.arguments : "";
    try {
      args = JSON.stringify(JSON.parse(args), null, 2); // a complete JSON preview reads better indented
    } catch (_) {
      /* a cut preview: shown as it came */
    }
    card.args.textContent = args;
    card.args.hidden = !args;

    const head = typeof data.output_head === "string" ? data.output_head : "";
    const tail = typeof data.output_tail === "string" ? data.output_tail : "";
    const omitted = Number.isInteger(data.omitted_lines) && data.omitted_lines > 0 ? data.omitted_lines : 0;
    card.output.replaceChildren(head);
    if (omitted) {
      const gap = el("span", "omitted", `… ${omitted} ${omitted === 1 ? "line" : "lines"} omitted …`);
      card.output.append(head ? "\n" : "", gap);
    }
    if (tail) card.output.append(head || omitted ? "\n" : "", tail);
    card.output.hidden = !head && !tail && !omitted;

    card.files.replaceChildren();
    for (const file of Array.isArray(data.files) ? data.files : []) {
      if (!file || typeof file.name !== "string") continue;
      const li = el("li");
      li.append(icon("file"), el("span", "", typeof file.path === "string" && file.path ? file.path : file.name));
      card.files.appendChild(li);
    }
    card.files.hidden = !card.files.childElementCount;
    if (!card.touched) card.details.open = state === "running";
  }

  /* ---------- files the agent sent ---------- */

  const PREVIEWABLE = new Set(["image/png", "image/jpeg", "image/gif", "image/webp"]);
  const MAX_DATA_URL = 1_500_000; // Chromium refuses URLs over 2 MB: a larger file gets a blob: URL instead

  // A file card in its place in the reply: icon or preview, name, size, type and a download link made locally from
  // the bytes (small files come inline, base64). The caption, if any, is under it; the name is never repeated.
  function renderFile(bubble, file, caption) {
    if (typeof file.data !== "string" || typeof file.name !== "string") return;
    let bytes;
    try {
      bytes = Uint8Array.from(atob(file.data), (c) => c.charCodeAt(0));
    } catch (_) {
      return; // not base64: show nothing rather than a broken link
    }
    const declared = typeof file.mime_type === "string" ? file.mime_type.trim().toLowerCase() : "";
    const type = /^[a-z0-9][\w.+-]*\/[\w.+-]+$/.test(declared) ? declared : "application/octet-stream";
    const size = typeof file.size === "number" && file.size >= 0 ? file.size : bytes.length;
    // Only a raster image keeps its type in the link: any other file is opaque bytes, so an HTML or SVG file opened
    // from its link (a blob: URL is of the chat's origin) is downloaded, never run as a page of the chat.
    const served = PREVIEWABLE.has(type) ? type : "application/octet-stream";
    const href =
      file.data.length <= MAX_DATA_URL
        ? `data:${served};base64,${file.data}`
        : URL.createObjectURL(new Blob([bytes], { type: served }));
    const card = el("figure", "file-card");
    card.dataset.testid = "msg-file";
    if (PREVIEWABLE.has(type)) {
      const img = el("img", "file-preview");
      img.dataset.testid = "file-preview";
      img.src = href;
      img.alt = file.name;
      card.appendChild(img);
    }
    const row = el("div", "file-row");
    const info = el("div", "file-info");
    const name = el("span", "file-name", file.name);
    name.dir = "auto";
    info.append(name, el("span", "file-meta", `${sizeLabel(size)} · ${type}`));
    const link = el("a", "file-download");
    link.dataset.testid = "file-download";
    link.href = href;
    link.download = file.name;
    link.setAttribute("aria-label", `Download ${file.name}`);
    link.append(icon("download"), el("span", "label", "Download"));
    row.append(icon("file"), info, link);
    card.appendChild(row);
    const text = typeof caption === "string" ? caption.trim() : "";
    if (text && text !== file.name) {
      const figcaption = el("figcaption", "file-caption");
      renderMarkdown(text, figcaption);
      card.appendChild(figcaption);
    }
    const wasNear = nearBottom();
    workOf(bubble).appendChild(card);
    keepScrolled(wasNear);
  }

  const PLAYABLE = new Set(["audio/ogg", "audio/mpeg", "audio/wav", "audio/webm", "audio/aac"]);

  // The answer spoken (a voice reply): an audio player under the answer's text, from a blob: URL of the bytes (the
  // page's policy lets media load from blob: only). Anything but a known audio type shows nothing.
  function renderVoice(bubble, file) {
    if (typeof file.data !== "string") return;
    const declared = typeof file.mime_type === "string" ? file.mime_type.trim().toLowerCase() : "";
    const type = declared.split(";")[0];
    if (!PLAYABLE.has(type) || bubble.li.querySelector(".msg-voice")) return;
    let bytes;
    try {
      bytes = Uint8Array.from(atob(file.data), (c) => c.charCodeAt(0));
    } catch (_) {
      return;
    }
    const audio = el("audio", "msg-voice");
    audio.dataset.testid = "msg-voice";
    audio.controls = true;
    audio.preload = "metadata";
    audio.setAttribute("aria-label", "The reply, spoken");
    audio.src = URL.createObjectURL(new Blob([bytes], { type }));
    const wasNear = nearBottom();
    bubble.li.appendChild(audio);
    keepScrolled(wasNear);
  }

  function onReplyError(data) {
    if (!data) return;
    const replyTo = data.reply_to || "";
    if (replyTo) started(replyTo);
    stopRunningCards();
    if (data.code === "cancelled") {
      const stopped = replies.get(replyTo);
      if (stopped) {
        stopped.li.classList.remove("streaming");
        stopped.li.setAttribute("aria-busy", "false");
      }
      systemLine(replyTo, String(data.message || "You stopped this reply."), "cancelled");
      return;
    }
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

  // The event types of the stream. A failed reply is "reply_error": an event named "error" would also fire the
  // EventSource's own connection-error handler, and the page would show "Reconnecting…" for good.
  const EVENT_TYPES = ["user", "status", "delta", "message", "reply_error", "tool", "choices_settled"];

  function retryLater() {
    connection.textContent = "Reconnecting…";
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(connect, reconnectDelay);
    reconnectDelay = Math.min(reconnectDelay * 2, 30000);
  }

  // A short-lived, single-use ticket opens the stream: EventSource cannot send the bearer token in a header, and a
  // token in the URL would end up in logs and history. Returns null when the token was refused (after starting over).
  async function streamUrl() {
    const response = await fetch("api/chat/stream-ticket", {
      method: "POST",
      headers: { Authorization: `Bearer ${auth.token}` },
      cache: "no-store",
    });
    if (response.status === 401) return null;
    if (!response.ok) throw new Error(`stream ticket: ${response.status}`);
    const body = await response.json();
    let url = `api/chat/stream?ticket=${encodeURIComponent(body.ticket)}`;
    if (lastEventId) url += `&last_event_id=${encodeURIComponent(lastEventId)}`;
    return url;
  }

  async function connect() {
    clearTimeout(reconnectTimer);
    if (source) source.close();
    source = null;
    const mine = generation;
    const current = ++attempt;
    const stale = () => mine !== generation || current !== attempt;
    if (connection.textContent !== "Reconnecting…") connection.textContent = "Connecting…";
    let url;
    try {
      url = await streamUrl();
    } catch (_) {
      if (!stale()) retryLater(); // offline, or the server is busy: try again
      return;
    }
    if (stale()) return;
    if (url === null) {
      await startOver(); // the session's token expired or was revoked
      return;
    }
    const es = new EventSource(url);
    source = es;
    es.onopen = () => {
      if (stale()) return;
      connection.textContent = "Connected";
      reconnectDelay = 1000;
    };
    for (const type of EVENT_TYPES) {
      es.addEventListener(type, (event) => {
        if (stale()) return;
        let data;
        try {
          data = JSON.parse(event.data);
        } catch (_) {
          return;
        }
        if (event.lastEventId) lastEventId = event.lastEventId;
        applyEvent(type, event.lastEventId, data);
      });
    }
    es.onerror = () => {
      if (stale()) return;
      // The ticket is spent, so the browser's own retry would be refused: close, and reconnect with a new one.
      es.close();
      retryLater();
    };
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
          saveAuth({ token: body.token, session: body.session, agent: body.agent || null });
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
    lastEventId = "";
    seen = new Set();
    users = new Map();
    pending = new Map();
    replies = new Map();
    order = [];
    tools = new Map();
    offers = new Map();
    settledEarly = new Map();
    notices = new Set();
    list.textContent = "";
    setRunning(false);
  }

  async function startOver() {
    resetView();
    saveAuth(null);
    await createSession();
    renderEmpty();
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
        if (turn.files && !turn.uploads) sendFiles(turn);
        else deliver(turn, turn.text);
      });
      note.append(" ", retry);
    }
    turn.li.appendChild(note);
  }

  async function deliver(turn, text, choice) {
    setStatus(turn, "sending", "sending…");
    const mine = generation;
    for (let attempt = 0; attempt < SEND_ATTEMPTS; attempt += 1) {
      let response = null;
      try {
        response = await fetch("api/chat/messages", {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${auth.token}` },
          // The same client_id on every retry: the gateway keeps one message however often it arrives.
          body: JSON.stringify(
            choice
              ? { choice, text, client_id: turn.clientId }
              : turn.uploads
                ? { text, attachments: turn.uploads, client_id: turn.clientId }
                : { text, client_id: turn.clientId },
          ),
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

  // "/stop" stops the reply being written (the model request and its tools); queued messages still run. It is a
  // command, not a message: no bubble, and the stream's one notice says what it did.
  async function postStop() {
    const clientId = uuid();
    stopIds.add(clientId);
    const mine = generation;
    for (let attempt = 0; attempt < 3; attempt += 1) {
      try {
        const response = await fetch("api/chat/messages", {
          method: "POST",
          headers: { "Content-Type": "application/json", Authorization: `Bearer ${auth.token}` },
          body: JSON.stringify({ text: "/stop", client_id: clientId }),
        });
        if (mine !== generation || response.status < 500) return;
      } catch (_) {
        /* network error: retry below */
      }
      await sleep(500 * 2 ** attempt);
    }
  }

  function send(text) {
    if (isStopText(text)) {
      postStop();
      return;
    }
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

  async function errorMessage(response, fallback) {
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) return body.error.message;
    } catch (_) {
      /* not JSON */
    }
    return fallback;
  }

  // Upload each file (POST api/chat/uploads, the raw bytes), then send the message naming the uploads.
  async function sendFiles(turn) {
    setStatus(turn, "sending", "uploading…");
    const mine = generation;
    const uploads = [];
    for (const file of turn.files) {
      let response = null;
      try {
        response = await fetch(`api/chat/uploads?filename=${encodeURIComponent(file.name)}`, {
          method: "POST",
          headers: { "Content-Type": file.type || "application/octet-stream", Authorization: `Bearer ${auth.token}` },
          body: file,
        });
      } catch (_) {
        response = null;
      }
      if (mine !== generation) return;
      if (!response) {
        showSendError(turn, `Could not upload ${file.name}.`, true);
        return;
      }
      if (response.status === 413) {
        showSendError(turn, `${file.name} is too large: ${await errorMessage(response, "over the size limit")}.`, false);
        return;
      }
      if (response.status !== 201) {
        const message = await errorMessage(response, `the upload was refused (${response.status})`);
        showSendError(turn, `${file.name}: ${message}`, response.status >= 500 || response.status === 429);
        return;
      }
      uploads.push((await response.json()).upload);
    }
    turn.uploads = uploads;
    deliver(turn, turn.text);
  }

  function sendWithFiles(text, files) {
    const turn = userTurn(text, uuid(), files);
    turn.text = text;
    turn.files = files;
    pending.set(turn.clientId, turn);
    sendFiles(turn);
  }

  /* ---------- files to attach ---------- */

  function showAttachError(message) {
    attachError.textContent = message;
    attachError.hidden = !message;
  }

  function renderChosen() {
    chosenList.replaceChildren();
    chosen.forEach((file, index) => {
      const li = el("li");
      li.append(icon("file"), `${file.name} (${sizeLabel(file.size)})`);
      li.dataset.testid = "chosen-file";
      const remove = el("button");
      remove.appendChild(icon("x"));
      remove.type = "button";
      remove.setAttribute("aria-label", `Remove ${file.name}`);
      remove.addEventListener("click", () => {
        chosen.splice(index, 1);
        renderChosen();
        input.focus();
      });
      li.appendChild(remove);
      chosenList.appendChild(li);
    });
    chosenList.hidden = chosen.length === 0;
  }

  function addFiles(files) {
    showAttachError("");
    for (const file of files) {
      if (chosen.length >= MAX_FILES) {
        showAttachError(`At most ${MAX_FILES} files per message.`);
        break;
      }
      if (file.size === 0) {
        showAttachError(`${file.name} is empty.`);
        continue;
      }
      chosen.push(file);
    }
    renderChosen();
  }

  function sendChoice(id, label) {
    const turn = userTurn(label, uuid());
    turn.text = label;
    pending.set(turn.clientId, turn);
    deliver(turn, label, id);
  }

  /* ---------- wiring ---------- */

  function autosize() {
    input.style.height = "auto";
    input.style.height = `${Math.min(input.scrollHeight, 160)}px`;
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value;
    if ((!text.trim() && chosen.length === 0) || !auth) return;
    input.value = "";
    autosize();
    if (chosen.length) {
      const files = chosen;
      chosen = [];
      renderChosen();
      showAttachError("");
      sendWithFiles(text.trim() ? text : "", files);
    } else {
      send(text);
    }
    input.focus();
  });

  attachButton.addEventListener("click", () => fileInput.click());
  fileInput.addEventListener("change", () => {
    addFiles(Array.from(fileInput.files || []));
    fileInput.value = ""; // picking the same file again fires change again
    input.focus();
  });

  // Drag and drop files anywhere on the chat.
  let dragDepth = 0;
  const carriesFiles = (event) => event.dataTransfer && Array.from(event.dataTransfer.types || []).includes("Files");
  app.addEventListener("dragenter", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    dragDepth += 1;
    app.classList.add("dragging");
  });
  app.addEventListener("dragover", (event) => {
    if (carriesFiles(event)) event.preventDefault();
  });
  app.addEventListener("dragleave", () => {
    dragDepth = Math.max(0, dragDepth - 1);
    if (dragDepth === 0) app.classList.remove("dragging");
  });
  app.addEventListener("drop", (event) => {
    if (!carriesFiles(event)) return;
    event.preventDefault();
    dragDepth = 0;
    app.classList.remove("dragging");
    addFiles(Array.from(event.dataTransfer.files || []));
    input.focus();
  });

  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit(sendButton);
    }
  });
  input.addEventListener("input", autosize);

  stopButton.addEventListener("click", () => {
    if (running && auth) postStop();
  });

  newChat.addEventListener("click", () => {
    startOver();
    input.focus();
  });

  /* ---------- the empty chat ---------- */

  // The agent's name and description, and one button per starter (from the session's creation), until a message.
  function renderEmpty() {
    const agent = auth && auth.agent && typeof auth.agent === "object" ? auth.agent : null;
    const name = agent && typeof agent.name === "string" && agent.name.trim() ? agent.name : "Switchboard";
    const description = agent && typeof agent.description === "string" ? agent.description.trim() : "";
    const starters = agent && Array.isArray(agent.starters) ? agent.starters : [];
    emptyName.textContent = name;
    emptyDescription.textContent = description;
    emptyDescription.hidden = !description;
    startersRow.replaceChildren();
    for (const starter of starters) {
      const text = starter && typeof starter.text === "string" ? starter.text : "";
      const label = starter && typeof starter.label === "string" && starter.label.trim() ? starter.label : text;
      if (!text.trim()) continue;
      const button = el("button", "starter", label);
      button.type = "button";
      if (label !== text) button.title = text;
      button.addEventListener("click", () => {
        if (!auth) return;
        send(text);
        input.focus();
      });
      startersRow.appendChild(button);
    }
    emptyHint.textContent = startersRow.childElementCount
      ? "Write a message below, or start with one of these:"
      : "Write a message below to start.";
    updateEmpty();
  }

  function updateEmpty() {
    emptyState.hidden = !auth || list.childElementCount > 0;
  }

  new MutationObserver(updateEmpty).observe(list, { childList: true });

  async function start() {
    if (!auth) await createSession();
    renderEmpty();
    connect();
  }

  start();
})();
