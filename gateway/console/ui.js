// DOM helpers. Every element is built with createElement and text nodes, never from HTML
// strings, so nothing the API answers is ever parsed as markup.

/**
 * `h('button', {type: 'button', onclick: f, class: 'primary'}, 'Save')`. Attributes starting
 * with `on` are listeners; `class`, `for`, `hidden`, `disabled`, `value`, `checked` are the
 * usual ones; `dataset` takes an object; children may be strings, nodes, arrays or null.
 */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes || {})) {
    if (value === undefined || value === null || value === false) {
      continue;
    }
    if (key.startsWith('on') && typeof value === 'function') {
      element.addEventListener(key.slice(2), value);
    } else if (key === 'class') {
      element.className = value;
    } else if (key === 'dataset') {
      Object.assign(element.dataset, value);
    } else if (key === 'value' || key === 'checked' || key === 'disabled' || key === 'hidden'
      || key === 'selected' || key === 'multiple' || key === 'required') {
      element[key] = value;
    } else if (value === true) {
      element.setAttribute(key, '');
    } else {
      element.setAttribute(key, String(value));
    }
  }
  append(element, children);
  return element;
}

export function append(parent, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

export function clear(element) {
  while (element.firstChild) {
    element.firstChild.remove();
  }
  return element;
}

/** Milliseconds since the epoch, in the viewer's local time. */
export function time(ms) {
  if (ms === null || ms === undefined || ms === 0) {
    return '—';
  }
  const date = new Date(ms);
  return h('time', { datetime: date.toISOString() }, date.toLocaleString());
}

export function bytes(n) {
  if (n === null || n === undefined) {
    return '—';
  }
  const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = Number(n);
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} ${value === 1 ? 'byte' : 'bytes'}` : `${value.toFixed(1)} ${units[unit]}`;
}

/** `3 files`, `1 file`. */
export function count(n, noun) {
  return `${n} ${noun}${n === 1 ? '' : 's'}`;
}

export function duration(ms) {
  if (ms === null || ms === undefined || ms < 0) {
    return '—';
  }
  const seconds = Math.round(ms / 1000);
  if (seconds < 60) {
    return `${seconds} s`;
  }
  const minutes = Math.floor(seconds / 60);
  return `${minutes} min ${seconds % 60} s`;
}

/** A status word as a coloured badge: ready, building, failed, empty, active, ended. */
export function badge(status, extra) {
  return h('span', { class: `badge badge-${status}` }, extra ? `${status} · ${extra}` : status);
}

export function spinner(label) {
  return h('span', { class: 'spinner', role: 'status' },
    h('span', { class: 'spinner-dot', 'aria-hidden': 'true' }), label);
}

/** An error as the API gave it: its message and its code (and detail, when any). */
export function errorBox(error, ...actions) {
  const code = error && error.code ? error.code : 'error';
  const message = error && error.message ? error.message : String(error);
  return h('div', { class: 'error', role: 'alert' },
    h('p', {}, h('strong', {}, 'Error: '), message),
    h('p', { class: 'error-code' }, 'code ', h('code', {}, code),
      error && error.status ? ` · HTTP ${error.status}` : null),
    error && error.detail ? h('details', {}, h('summary', {}, 'Detail'),
      h('pre', {}, JSON.stringify(error.detail, null, 2))) : null,
    actions.length ? h('p', { class: 'actions' }, actions) : null);
}

export function notice(text, kind = 'info') {
  return h('div', { class: `notice notice-${kind}`, role: kind === 'info' ? 'status' : 'alert' }, text);
}

/** A labelled input: `field('Name', input)`. */
export function field(label, control, hint) {
  if (!control.id) {
    control.id = uid('field');
  }
  let hintElement = null;
  if (hint) {
    hintElement = h('span', { class: 'hint', id: `${control.id}-hint` }, hint);
    control.setAttribute('aria-describedby', hintElement.id);
  }
  return h('div', { class: 'field' }, h('label', { for: control.id }, label), control, hintElement);
}

let counter = 0;
export function uid(prefix) {
  counter += 1;
  return `${prefix}-${counter}`;
}

/** A button that shows progress while its async action runs, and the error if it fails. */
export function actionButton(label, action, { kind = '', busyLabel, errorTarget } = {}) {
  const button = h('button', { type: 'button', class: kind }, label);
  button.addEventListener('click', async () => {
    if (button.disabled) {
      return;
    }
    button.disabled = true;
    button.setAttribute('aria-busy', 'true');
    const original = button.textContent;
    button.textContent = busyLabel || `${label}…`;
    if (errorTarget) {
      clear(errorTarget);
    }
    try {
      await action();
    } catch (error) {
      if (errorTarget) {
        append(errorTarget, errorBox(error));
      } else {
        throw error;
      }
    } finally {
      button.disabled = false;
      button.removeAttribute('aria-busy');
      button.textContent = original;
    }
  });
  return button;
}

/** A table; `columns` are header labels, `rows` arrays of cells. Scrolls sideways when narrow. */
export function table(columns, rows, caption) {
  // A scroll container (narrow screens) that the keyboard can reach and scroll.
  return h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption || columns.join(', ') },
    h('table', {},
      caption ? h('caption', {}, caption) : null,
      h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c)))),
      h('tbody', {}, rows.map((row) => h('tr', {}, row.map((cell, i) => (i === 0
        ? h('th', { scope: 'row' }, cell) : h('td', {}, cell))))))));
}

export function link(href, text, attributes = {}) {
  return h('a', { href, ...attributes }, text);
}

/** Sets the page's main heading and title, and moves focus there for screen readers. */
export function heading(text) {
  document.title = `${text} · Plinth`;
  return h('h1', { tabindex: '-1', id: 'page-heading' }, text);
}
