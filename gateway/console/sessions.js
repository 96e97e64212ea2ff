// Sessions: the list, creating one on an environment, ending one, and a terminal in it
// (xterm.js over the exec WebSocket).

import { api, listAll, query, auth } from './api.js';
import {
  h, append, clear, time, badge, errorBox, field, heading, table, link, actionButton, notice, spinner,
} from './ui.js';
import { breadcrumb } from './environments.js';

export async function sessionsView(root, _params, context) {
  const state = context.query.get('state') || 'active';
  const after = context.query.get('after') || undefined;
  const [page, environments] = await Promise.all([
    api('GET', `/v1/sessions${query({ state: state === 'all' ? undefined : state, limit: 50, after })}`, { signal: context.signal }),
    listAll('/v1/environments', {}, 1000).then((r) => r.items),
  ]);
  const names = new Map(environments.map((e) => [e.id, e.name]));

  const select = h('select', { id: 'session-env' },
    environments.filter((e) => e.version !== null).map((e) => h('option', { value: e.id }, `${e.name} (v${e.version})`)));
  const errors = h('div', { 'aria-live': 'polite' });
  const create = h('form', { class: 'card', 'aria-labelledby': 'new-s' },
    h('h2', { id: 'new-s' }, 'New session'),
    select.options.length ? [
      field('Environment', select, 'The session reads its active version, read-only, beside a private working directory.'),
      errors,
      h('p', { class: 'actions' }, h('button', { type: 'submit', class: 'primary' }, 'Start session')),
    ] : h('p', { class: 'empty' }, 'No environment has a built version yet.'));
  create.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(errors);
    const button = create.querySelector('button[type=submit]');
    button.disabled = true;
    append(errors, spinner(' Starting the session…'));
    try {
      const session = await api('POST', '/v1/sessions', { json: { environment: select.value } });
      context.navigate(`#/sessions/${session.id}`);
    } catch (error) {
      clear(errors);
      append(errors, errorBox(error));
    } finally {
      button.disabled = false;
    }
  });

  const filter = h('nav', { class: 'tabs', 'aria-label': 'Which sessions' }, h('ul', {},
    [['active', 'Active'], ['ended', 'Ended'], ['all', 'All']].map(([key, label]) => h('li', {},
      h('a', { href: `#/sessions?state=${key}`, 'aria-current': key === state ? 'page' : null }, label)))));
  const rows = page.data.map((s) => [
    link(`#/sessions/${s.id}`, s.id),
    badge(s.status),
    link(`#/environments/${s.environment.id}`, names.get(s.environment.id) || s.environment.id),
    `v${s.environment.version}`,
    String(s.turns),
    time(s.createdAt),
    time(s.endedAt),
  ]);
  append(root, [
    heading('Sessions'),
    filter,
    rows.length ? table(['Session', 'Status', 'Environment', 'Version', 'Turns', 'Started', 'Ended'], rows, 'Oldest first')
      : h('p', { class: 'empty' }, `No ${state === 'all' ? '' : `${state} `}sessions.`),
    page.has_more && page.next ? h('nav', { class: 'pager', 'aria-label': 'Pages' },
      link(`#/sessions?${new URLSearchParams({ state, after: page.next })}`, 'Next page →')) : null,
    create,
  ]);
}

export async function sessionView(root, { id }, context) {
  const session = await api('GET', `/v1/sessions/${encodeURIComponent(id)}`, { signal: context.signal });
  const environment = await api('GET', `/v1/environments/${session.environment.id}`, { signal: context.signal }).catch(() => null);
  const active = session.status === 'active';
  const limits = Object.entries(session.limits || {}).map(([k, v]) => `${k} ${v === null ? 'none' : v}`).join(', ');
  const facts = h('dl', { class: 'facts' },
    h('dt', {}, 'Status'), h('dd', { id: 'session-status' }, badge(session.status)),
    h('dt', {}, 'Environment'), h('dd', {}, environment ? link(`#/environments/${environment.id}`, environment.name) : session.environment.id,
      ` · version ${session.environment.version} at `, h('code', {}, session.environment.mount)),
    h('dt', {}, 'Working directory'), h('dd', {}, h('code', {}, session.workdir)),
    h('dt', {}, 'Isolated'), h('dd', {}, session.isolated ? 'yes' : 'no: the server runs without a sandbox'),
    h('dt', {}, 'Turns'), h('dd', {}, String(session.turns)),
    h('dt', {}, 'Limits'), h('dd', {}, limits || '—'),
    h('dt', {}, 'Started'), h('dd', {}, time(session.createdAt)),
    h('dt', {}, 'Ended'), h('dd', {}, time(session.endedAt)),
    h('dt', {}, 'Harness'), h('dd', {}, session.harness_id || '—'));

  const endErrors = h('div', { 'aria-live': 'polite' });
  const endArea = h('span', {});
  const askEnd = h('button', { type: 'button', class: 'danger' }, 'End session…');
  askEnd.addEventListener('click', () => {
    askEnd.hidden = true;
    const yes = actionButton('End it now', async () => {
      await api('DELETE', `/v1/sessions/${encodeURIComponent(id)}`);
      context.rerender();
    }, { kind: 'danger', busyLabel: 'Ending…', errorTarget: endErrors });
    const no = h('button', { type: 'button', onclick: () => { clear(endArea); askEnd.hidden = false; askEnd.focus(); } }, 'Cancel');
    append(endArea, [h('span', { class: 'muted' }, 'Its commands are stopped and its working directory removed. '), yes, ' ', no]);
    yes.focus();
  });

  const terminalCard = h('section', { class: 'card', 'aria-labelledby': 'term-h' }, h('h2', { id: 'term-h' }, 'Terminal'));
  append(root, [
    breadcrumb(['Sessions', '#/sessions'], [id]),
    heading(`Session ${id}`),
    h('div', { class: 'grid' },
      h('section', { class: 'card', 'aria-labelledby': 'sf-h' }, h('h2', { id: 'sf-h' }, 'Overview'), facts,
        active ? h('p', { class: 'actions' }, askEnd, endArea) : null, endErrors),
      h('section', { class: 'card', 'aria-labelledby': 'in-h' }, h('h2', { id: 'in-h' }, 'What its agent is told'),
        h('pre', { class: 'wrap' }, session.instructions || '—'))),
    terminalCard,
  ]);
  if (!active) {
    append(terminalCard, h('p', { class: 'empty' }, 'The session has ended.'));
    return;
  }
  const command = h('input', { type: 'text', autocomplete: 'off', spellcheck: 'false', placeholder: 'an interactive shell' });
  const open = h('button', { type: 'button', class: 'primary', id: 'open-terminal' }, 'Open terminal');
  const holder = h('div', {});
  append(terminalCard, [
    h('div', { class: 'inline-form' }, field('Command (optional)', command), open),
    holder,
  ]);
  open.addEventListener('click', () => {
    open.disabled = true;
    clear(holder);
    openTerminal(holder, id, command.value.trim(), context, () => {
      open.disabled = false;
      open.textContent = 'Open another terminal';
    });
  });
}

/** Opens a terminal in `holder`: asks a ticket when signed in with a token, then the socket. */
async function openTerminal(holder, id, command, context, onClosed) {
  const status = h('p', { class: 'term-status', role: 'status', id: 'terminal-status' }, spinner(' Connecting…'));
  const screen = h('div', { class: 'terminal', id: 'terminal' });
  const close = h('button', { type: 'button' }, 'Disconnect');
  append(holder, [status, screen, h('p', { class: 'actions' }, close,
    h('span', { class: 'muted' }, 'The terminal takes Tab; Shift+Escape moves focus out of it.'))]);

  if (typeof window.Terminal !== 'function' || !window.FitAddon) {
    clear(status);
    append(status, errorBox({ code: 'terminal_unavailable', message: 'The terminal component did not load.' }));
    onClosed();
    return;
  }
  const term = new window.Terminal({
    cursorBlink: true,
    convertEol: false,
    fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace',
    fontSize: 14,
    scrollback: 5000,
    theme: { background: '#14171c', foreground: '#e6e6e6' },
  });
  const fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  // Tab belongs to the shell; give keyboard users a way out of the terminal.
  term.attachCustomKeyEventHandler((event) => {
    if (event.type === 'keydown' && event.key === 'Escape' && event.shiftKey) {
      close.focus();
      return false;
    }
    return true;
  });
  try { fit.fit(); } catch { /* not laid out yet */ }

  let socket = null;
  let ended = false;
  const disposers = [];
  const finish = (message, kind) => {
    if (ended) return;
    ended = true;
    clear(status);
    append(status, message instanceof Node ? message : h('span', { class: kind || '' }, message));
    close.disabled = true;
    for (const dispose of disposers) {
      try { dispose(); } catch { /* already gone */ }
    }
    term.options.disableStdin = true;
    onClosed();
  };
  close.addEventListener('click', () => {
    if (socket) socket.close(1000, 'closed by the viewer');
    finish('Disconnected. Whatever the command left running keeps running in the session.');
  });
  context.onLeave(() => {
    ended = true;
    if (socket) socket.close(1000, 'left the page');
    for (const dispose of disposers) {
      try { dispose(); } catch { /* already gone */ }
    }
    term.dispose();
  });

  const params = { pty: 'true', command: command || undefined, cols: term.cols, rows: term.rows };
  if (auth.token()) {
    try {
      const ticket = await api('POST', `/v1/sessions/${encodeURIComponent(id)}/terminal-tickets`, { signal: context.signal });
      params.ticket = ticket.ticket;
    } catch (error) {
      if (error.name === 'AbortError') return;
      finish(errorBox(error));
      return;
    }
  }
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  const url = `${scheme}//${location.host}/v1/sessions/${encodeURIComponent(id)}/exec${query(params)}`;
  socket = new WebSocket(url);
  socket.binaryType = 'arraybuffer';
  const encoder = new TextEncoder();
  let opened = false;
  let exitCode = null;

  const send = (data) => {
    if (socket.readyState === WebSocket.OPEN) socket.send(data);
  };
  const sendSize = () => send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));

  socket.addEventListener('open', () => {
    opened = true;
    clear(status);
    append(status, h('span', { class: 'ok' }, `Connected: ${command ? h('code', {}, command).textContent : 'interactive shell'} · ${term.cols}×${term.rows}`));
    sendSize();
    term.focus();
  });
  socket.addEventListener('message', (event) => {
    if (typeof event.data === 'string') {
      let control;
      try { control = JSON.parse(event.data); } catch { return; }
      if (control.type === 'exit') {
        exitCode = control.exit_code;
      }
      return;
    }
    term.write(new Uint8Array(event.data));
  });
  socket.addEventListener('close', (event) => {
    if (exitCode !== null) {
      finish(h('span', { class: exitCode === 0 ? 'ok' : 'warn', id: 'terminal-exit' },
        `The command exited with status ${exitCode}.`));
    } else if (!opened) {
      finish(errorBox({
        code: 'terminal_refused',
        message: 'The server refused the terminal. The session may have ended, or the ticket expired; reload the page and try again.',
      }));
    } else {
      finish(`The connection closed (${event.code}${event.reason ? `: ${event.reason}` : ''}).`);
    }
  });

  const input = term.onData((data) => send(encoder.encode(data)));
  const binary = term.onBinary((data) => {
    const bytes = new Uint8Array(data.length);
    for (let i = 0; i < data.length; i += 1) bytes[i] = data.charCodeAt(i) & 0xff;
    send(bytes);
  });
  const resize = term.onResize(() => {
    sendSize();
    if (opened && !ended) {
      const line = status.querySelector('.ok');
      if (line) line.textContent = line.textContent.replace(/\d+×\d+$/, `${term.cols}×${term.rows}`);
    }
  });
  disposers.push(() => input.dispose(), () => binary.dispose(), () => resize.dispose());

  // Fit the terminal to its box whenever the box changes size (the window, a phone turning).
  let frame = 0;
  const observer = new ResizeObserver(() => {
    cancelAnimationFrame(frame);
    frame = requestAnimationFrame(() => {
      if (!ended) {
        try { fit.fit(); } catch { /* hidden */ }
      }
    });
  });
  observer.observe(screen);
  disposers.push(() => observer.disconnect(), () => cancelAnimationFrame(frame));
}
