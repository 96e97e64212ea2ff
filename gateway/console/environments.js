// Environments: the list (paged), create, and one environment's overview (rename, delete,
// build, its harnesses and sessions).

import { api, query } from './api.js';
import {
  h, append, clear, time, bytes, count, badge, errorBox, field, heading, table, link, actionButton, notice, spinner,
} from './ui.js';

export function envStatus(environment) {
  const build = environment.build;
  if (build && build.status === 'building') {
    return badge('building', build.phase);
  }
  return badge(environment.status);
}

export async function environmentsView(root, _params, context) {
  const after = context.query.get('after') || undefined;
  // The cursors of the pages before this one ('~' is the first page), for "Previous".
  const previous = context.query.get('prev') ? context.query.get('prev').split(',') : [];
  const page = await api('GET', `/v1/environments${query({ limit: 25, after })}`, { signal: context.signal });

  const name = h('input', { type: 'text', name: 'name', required: true, maxlength: '200', autocomplete: 'off' });
  const description = h('input', { type: 'text', name: 'description', maxlength: '4000', autocomplete: 'off' });
  const entry = h('input', { type: 'text', name: 'entry', maxlength: '4000', autocomplete: 'off', placeholder: 'python3 main.py' });
  const errors = h('div', { 'aria-live': 'polite' });
  const submit = h('button', { type: 'submit', class: 'primary' }, 'Create environment');
  const form = h('form', { class: 'card', 'aria-labelledby': 'create-env' },
    h('h2', { id: 'create-env' }, 'New environment'),
    h('div', { class: 'row' },
      field('Name', name, 'Its slug, and so its mount path /env/<slug>, comes from the name and never changes.'),
      field('Description (optional)', description),
      field('Entry command (optional)', entry)),
    errors,
    h('p', { class: 'actions' }, submit));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(errors);
    if (!name.value.trim()) {
      append(errors, notice('Give the environment a name.', 'warn'));
      name.focus();
      return;
    }
    submit.disabled = true;
    submit.textContent = 'Creating…';
    try {
      const body = { name: name.value.trim() };
      if (description.value.trim()) body.description = description.value.trim();
      if (entry.value.trim()) body.entry = entry.value.trim();
      const created = await api('POST', '/v1/environments', { json: body });
      context.navigate(`#/environments/${created.id}`);
    } catch (error) {
      append(errors, errorBox(error));
    } finally {
      submit.disabled = false;
      submit.textContent = 'Create environment';
    }
  });

  const rows = page.data.map((environment) => [
    link(`#/environments/${environment.id}`, environment.name),
    h('code', {}, environment.slug),
    envStatus(environment),
    environment.version === null ? '—' : `v${environment.version}`,
    `${count(environment.files.count, 'file')} · ${bytes(environment.files.bytes)}`,
    time(environment.updatedAt),
  ]);
  const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' },
    previous.length ? link(pageHref(previous.slice(0, -1), previous[previous.length - 1]), '← Previous page') : null,
    page.has_more && page.next ? link(pageHref([...previous, after || '~'], page.next), 'Next page →') : null);
  append(root, [
    heading('Environments'),
    page.data.length
      ? table(['Name', 'Slug', 'Status', 'Active', 'Source', 'Updated'], rows, 'Your environments, oldest first')
      : h('p', { class: 'empty' }, after ? 'No more environments.' : 'No environments yet: create one below.'),
    pager,
    form,
  ]);
}

function pageHref(previous, after) {
  const search = new URLSearchParams();
  if (after && after !== '~') search.set('after', after);
  if (previous.length) search.set('prev', previous.join(','));
  const text = search.toString();
  return `#/environments${text ? `?${text}` : ''}`;
}

/** The environment's section links, shown on each of its pages. */
export function envTabs(id, active) {
  const tabs = [
    ['overview', `#/environments/${id}`, 'Overview'],
    ['files', `#/environments/${id}/files`, 'Files'],
    ['versions', `#/environments/${id}/versions`, 'Builds & versions'],
  ];
  return h('nav', { class: 'tabs', 'aria-label': 'Environment' },
    h('ul', {}, tabs.map(([key, href, label]) => h('li', {},
      h('a', { href, 'aria-current': key === active ? 'page' : null }, label)))));
}

export function breadcrumb(...items) {
  return h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' },
    h('ol', {}, items.map(([label, href]) => h('li', {}, href ? link(href, label) : h('span', { 'aria-current': 'page' }, label)))));
}

/** Starts a build and opens its page. */
export async function startBuild(id, clean, context) {
  const record = await api('POST', `/v1/environments/${id}/build`, clean ? { json: { clean: true } } : {});
  context.navigate(`#/environments/${id}/builds/${record.version}`);
}

export function buildControls(environment, context) {
  const clean = h('input', { type: 'checkbox', id: 'build-clean' });
  const errors = h('div', { 'aria-live': 'polite' });
  const running = environment.build && environment.build.status === 'building';
  return h('section', { class: 'card', 'aria-labelledby': 'build-h' },
    h('h2', { id: 'build-h' }, 'Build'),
    h('p', {}, 'A build installs the source as it is now into the next version; when it succeeds it becomes active.'),
    running ? h('p', {}, spinner(`Version ${environment.build.version} is building (${environment.build.phase || 'queued'}). `),
      link(`#/environments/${environment.id}/builds/${environment.build.version}`, 'Follow its log')) : null,
    h('div', { class: 'check' }, clean, h('label', { for: 'build-clean' }, 'Clean: reuse nothing from earlier builds')),
    errors,
    h('p', { class: 'actions' }, actionButton('Start a build', () => startBuild(environment.id, clean.checked, context),
      { kind: 'primary', busyLabel: 'Starting…', errorTarget: errors })));
}

export async function environmentView(root, { id }, context) {
  const [environment, harnesses, sessions] = await Promise.all([
    api('GET', `/v1/environments/${id}`, { signal: context.signal }),
    api('GET', `/v1/environments/${id}/harnesses?limit=100`, { signal: context.signal }).catch((error) => error),
    api('GET', `/v1/sessions${query({ environment: id, state: 'active', limit: 100 })}`, { signal: context.signal }).catch((error) => error),
  ]);

  const facts = h('dl', { class: 'facts' },
    h('dt', {}, 'Status'), h('dd', {}, envStatus(environment)),
    h('dt', {}, 'Mount'), h('dd', {}, h('code', {}, environment.mount)),
    h('dt', {}, 'Active version'), h('dd', {}, environment.version === null ? 'none yet' : `v${environment.version}`),
    h('dt', {}, 'Latest version'), h('dd', {}, environment.latestVersion === null ? 'none yet'
      : link(`#/environments/${id}/builds/${environment.latestVersion}`, `v${environment.latestVersion}`)),
    h('dt', {}, 'Source'), h('dd', {}, `${count(environment.files.count, 'file')}, ${bytes(environment.files.bytes)}`),
    h('dt', {}, 'Entry'), h('dd', {}, environment.entry ? h('code', {}, environment.entry) : '—'),
    h('dt', {}, 'Description'), h('dd', {}, environment.description || '—'),
    h('dt', {}, 'Created'), h('dd', {}, time(environment.createdAt)),
    h('dt', {}, 'Updated'), h('dd', {}, time(environment.updatedAt)),
    h('dt', {}, 'Id'), h('dd', {}, h('code', {}, environment.id)));

  const lastError = environment.build && environment.build.status === 'failed' ? environment.build.error : '';

  // Rename.
  const newName = h('input', { type: 'text', value: environment.name, maxlength: '200', autocomplete: 'off' });
  const renameErrors = h('div', { 'aria-live': 'polite' });
  const renameForm = h('form', { class: 'inline-form' },
    field('Name', newName, `The slug (${environment.slug}) and mount path stay.`),
    h('button', { type: 'submit' }, 'Rename'));
  renameForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(renameErrors);
    const button = renameForm.querySelector('button');
    button.disabled = true;
    try {
      await api('PUT', `/v1/environments/${id}`, { json: { name: newName.value.trim() } });
      context.rerender();
    } catch (error) {
      append(renameErrors, errorBox(error));
    } finally {
      button.disabled = false;
    }
  });

  // Delete, in two steps.
  const deleteArea = h('div', {});
  const deleteErrors = h('div', { 'aria-live': 'polite' });
  const askDelete = h('button', { type: 'button', class: 'danger' }, 'Delete environment…');
  askDelete.addEventListener('click', () => {
    askDelete.hidden = true;
    const confirmName = h('input', { type: 'text', autocomplete: 'off', spellcheck: 'false' });
    const cancel = h('button', { type: 'button' }, 'Cancel');
    const confirmButton = actionButton('Delete permanently', async () => {
      if (confirmName.value !== environment.name) {
        throw { code: 'not_confirmed', message: `Type the name exactly (“${environment.name}”) to delete.` };
      }
      await api('DELETE', `/v1/environments/${id}`);
      context.navigate('#/environments');
    }, { kind: 'danger', busyLabel: 'Deleting…', errorTarget: deleteErrors });
    cancel.addEventListener('click', () => {
      clear(deleteArea);
      clear(deleteErrors);
      askDelete.hidden = false;
      askDelete.focus();
    });
    append(deleteArea, h('div', { class: 'confirm', role: 'group', 'aria-label': 'Confirm deletion' },
      h('p', {}, `This deletes “${environment.name}”, its source and every version. Sessions on it keep running until they end. This cannot be undone.`),
      field(`Type “${environment.name}” to confirm`, confirmName),
      h('p', { class: 'actions' }, confirmButton, cancel)));
    confirmName.focus();
  });

  const harnessList = harnesses instanceof Error ? errorBox(harnesses)
    : harnesses.data.length ? table(['Harness', 'Base', 'Created'],
      harnesses.data.map((harness) => [harness.name, harness.base, time(harness.createdAt)]))
      : h('p', { class: 'empty' }, 'No harness names this environment.');
  const sessionList = sessions instanceof Error ? errorBox(sessions)
    : sessions.data.length ? table(['Session', 'Version', 'Started'],
      sessions.data.map((session) => [link(`#/sessions/${session.id}`, session.id), `v${session.environment.version}`, time(session.createdAt)]))
      : h('p', { class: 'empty' }, 'No active session.');

  const newSessionErrors = h('div', { 'aria-live': 'polite' });

  append(root, [
    breadcrumb(['Environments', '#/environments'], [environment.name]),
    heading(environment.name),
    envTabs(id, 'overview'),
    lastError ? h('div', { class: 'error', role: 'alert' }, h('p', {}, h('strong', {}, `Build v${environment.build.version} failed:`), ' ',
      link(`#/environments/${id}/builds/${environment.build.version}`, 'see its log')), h('pre', { class: 'reason' }, lastError)) : null,
    h('div', { class: 'grid' },
      h('section', { class: 'card', 'aria-labelledby': 'facts-h' }, h('h2', { id: 'facts-h' }, 'Overview'), facts),
      buildControls(environment, context)),
    h('div', { class: 'grid' },
      h('section', { class: 'card', 'aria-labelledby': 'sess-h' }, h('h2', { id: 'sess-h' }, 'Active sessions'), sessionList,
        newSessionErrors,
        h('p', { class: 'actions' }, actionButton('New session', async () => {
          const session = await api('POST', '/v1/sessions', { json: { environment: id } });
          context.navigate(`#/sessions/${session.id}`);
        }, { busyLabel: 'Starting…', errorTarget: newSessionErrors }))),
      h('section', { class: 'card', 'aria-labelledby': 'harn-h' }, h('h2', { id: 'harn-h' }, 'Harnesses naming it'), harnessList)),
    h('section', { class: 'card', 'aria-labelledby': 'settings-h' },
      h('h2', { id: 'settings-h' }, 'Settings'), renameForm, renameErrors,
      h('h3', {}, 'Delete'), askDelete, deleteArea, deleteErrors),
  ]);
}
