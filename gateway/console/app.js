// The Plinth console: a hash-routed single page (`#/environments/<id>` and so on) over the
// REST API on this origin. Each view renders into <main>; leaving it aborts its requests and
// closes what it opened (log streams, terminals).

import { auth, setUnauthenticatedHandler, api } from './api.js';
import { h, clear, append, errorBox, heading, field, notice } from './ui.js';
import { environmentsView, environmentView } from './environments.js';
import { filesView } from './files.js';
import { buildView, versionsView, diffView } from './builds.js';
import { sessionsView, sessionView } from './sessions.js';
import { harnessesView, usageView } from './account.js';
import { routeInlineStyles } from './csp-styles.js';

routeInlineStyles();

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const who = document.getElementById('who');

/** Routes: a pattern of segments (`:name` captures one, `*name` the rest) and its view. */
const routes = [
  ['signin', signInView],
  ['environments', environmentsView],
  ['environments/:id', environmentView],
  ['environments/:id/files', filesView],
  ['environments/:id/files/*path', filesView],
  ['environments/:id/builds/:version', buildView],
  ['environments/:id/versions', versionsView],
  ['environments/:id/diff/:from/:to', diffView],
  ['sessions', sessionsView],
  ['sessions/:id', sessionView],
  ['harnesses', harnessesView],
  ['usage', usageView],
];

function match(path) {
  const segments = path.split('/').filter(Boolean).map(decodeURIComponent);
  for (const [pattern, view] of routes) {
    const parts = pattern.split('/');
    const params = {};
    let ok = true;
    for (let i = 0; i < parts.length; i += 1) {
      const part = parts[i];
      if (part.startsWith('*')) {
        if (i >= segments.length) {
          ok = false;
          break;
        }
        params[part.slice(1)] = segments.slice(i).join('/');
        return { view, params, section: parts[0] };
      }
      if (i >= segments.length) {
        ok = false;
        break;
      }
      if (part.startsWith(':')) {
        params[part.slice(1)] = segments[i];
      } else if (part !== segments[i]) {
        ok = false;
        break;
      }
    }
    if (ok && parts.length === segments.length) {
      return { view, params, section: parts[0] };
    }
  }
  return null;
}

let current = null;

function leave() {
  if (current) {
    current.controller.abort();
    for (const cleanup of current.cleanups) {
      try {
        cleanup();
      } catch {
        // A view's cleanup never stops the next view.
      }
    }
    current = null;
  }
}

export function navigate(hash) {
  if (location.hash === hash) {
    render();
  } else {
    location.hash = hash;
  }
}

async function render() {
  leave();
  const raw = location.hash.replace(/^#/, '');
  if (!raw.startsWith('/')) {
    location.replace('#/environments');
    return;
  }
  const [path, search] = raw.slice(1).split('?');
  if (!auth.signedIn() && path !== 'signin') {
    location.replace('#/signin');
    return;
  }
  const found = match(path || 'environments');
  renderChrome(found ? found.section : '');
  const controller = new AbortController();
  const context = {
    signal: controller.signal,
    cleanups: [],
    controller,
    query: new URLSearchParams(search || ''),
    onLeave(cleanup) {
      this.cleanups.push(cleanup);
    },
    navigate,
    rerender: render,
  };
  current = context;
  clear(main);
  if (!found) {
    append(main, [heading('Not found'), h('p', {}, 'No page here. ',
      h('a', { href: '#/environments' }, 'Go to the environments.'))]);
    return;
  }
  const loading = h('p', { class: 'loading', role: 'status' }, 'Loading…');
  main.append(loading);
  try {
    await found.view(main, found.params, context);
  } catch (error) {
    if (error && error.name === 'AbortError') {
      return;
    }
    if (current === context) {
      if (error && error.status === 401) {
        return;
      }
      main.append(errorBox(error));
    }
  } finally {
    loading.remove();
  }
  if (current === context) {
    const target = main.querySelector('#page-heading');
    if (target && document.activeElement === document.body) {
      target.focus({ preventScroll: true });
    }
  }
}

function renderChrome(section) {
  const signedIn = auth.signedIn();
  nav.hidden = !signedIn;
  for (const anchor of nav.querySelectorAll('a')) {
    if (anchor.dataset.section === section) {
      anchor.setAttribute('aria-current', 'page');
    } else {
      anchor.removeAttribute('aria-current');
    }
  }
  clear(who);
  if (signedIn) {
    append(who, [
      h('span', { class: 'who-what' }, auth.token() ? 'Signed in with a token' : 'No token'),
      h('button', {
        type: 'button',
        class: 'link-button',
        onclick: () => {
          auth.signOut();
          navigate('#/signin');
        },
      }, 'Sign out'),
    ]);
  }
}

async function signInView(root, _params, context) {
  const why = auth.takeNotice();
  const token = h('input', {
    type: 'password', name: 'token', autocomplete: 'off', spellcheck: 'false',
  });
  const none = h('input', { type: 'checkbox', name: 'no-token' });
  const errors = h('div', { 'aria-live': 'polite' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Sign in');
  none.addEventListener('change', () => {
    token.disabled = none.checked;
  });
  const form = h('form', { class: 'card narrow', novalidate: true },
    heading('Sign in'),
    why ? errorBox({ code: 'unauthenticated', message: why, status: 401 }) : null,
    h('p', {}, 'Paste an API token of this Plinth server. It is kept in this tab only '
      + '(sessionStorage) and sent as a bearer token; no cookie is set.'),
    field('API token', token),
    h('div', { class: 'check' }, none, h('label', { for: (none.id = 'no-token') }, 'This server has tokens off: sign in without one')),
    errors,
    h('p', { class: 'actions' }, submit));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(errors);
    const value = none.checked ? '' : token.value.trim();
    if (!none.checked && !value) {
      append(errors, notice('Paste a token, or tick “tokens off”.', 'warn'));
      token.focus();
      return;
    }
    submit.disabled = true;
    submit.textContent = 'Signing in…';
    auth.signIn(value);
    try {
      await api('GET', '/v1/environments?limit=1', { signal: context.signal });
      navigate('#/environments');
    } catch (error) {
      if (error.status !== 401) {
        auth.signOut();
      }
      // A 401 already brought the sign-in page back with the API's message.
      if (error.status !== 401 && error.name !== 'AbortError') {
        append(errors, errorBox(error));
      }
    } finally {
      submit.disabled = false;
      submit.textContent = 'Sign in';
    }
  });
  append(root, form);
  token.focus();
}

setUnauthenticatedHandler(() => {
  // The API refused the token: back to sign-in, which shows the API's message.
  if (!location.hash.startsWith('#/signin')) {
    location.hash = '#/signin';
  } else {
    render();
  }
});

document.querySelector('.skip').addEventListener('click', (event) => {
  event.preventDefault();
  main.focus();
});

window.addEventListener('hashchange', render);
render();
