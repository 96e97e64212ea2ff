// Builds and versions: one build's record with its log followed live, the version list with
// activation (rolling back), and a diff between two versions.

import { api, listAll, query, offers, encodePath } from './api.js';
import {
  h, append, clear, time, bytes, badge, errorBox, heading, table, link, actionButton, notice, spinner, duration, field,
} from './ui.js';
import { envTabs, breadcrumb } from './environments.js';

/** The route a per-version file listing would have; see versionFiles. */
const VERSION_FILES = '/v1/environments/{id}/versions/{version}/files';

function packagesTable(packages) {
  if (!packages || !packages.length) {
    return h('p', { class: 'empty' }, 'No packages installed.');
  }
  return table(['Package', 'Version', 'Manager'], packages.map((p) => [p.name, p.version, p.manager]));
}

function toolchainList(toolchains) {
  if (!toolchains || !toolchains.length) return '—';
  return h('ul', { class: 'plain' }, toolchains.map((t) => h('li', {}, `${t.name} ${t.version} `, h('code', { class: 'muted' }, t.path))));
}

function buildStatus(record) {
  return record.status === 'building' ? badge('building', record.phase) : badge(record.status);
}

export async function buildView(root, { id, version }, context) {
  const [environment, record] = await Promise.all([
    api('GET', `/v1/environments/${id}`, { signal: context.signal }),
    api('GET', `/v1/environments/${id}/builds/${encodeURIComponent(version)}`, { signal: context.signal }),
  ]);
  const summary = h('div', {});
  const logBox = h('pre', { class: 'log', id: 'build-log', tabindex: '0', 'aria-label': 'Build log' });
  const progress = h('div', { class: 'build-progress', 'aria-live': 'polite' });
  append(root, [
    breadcrumb(['Environments', '#/environments'], [environment.name, `#/environments/${id}`],
      ['Builds & versions', `#/environments/${id}/versions`], [`Build v${record.version}`]),
    heading(`Build of version ${record.version}`),
    envTabs(id, 'versions'),
    summary,
    h('section', { class: 'card', 'aria-labelledby': 'log-h' },
      h('h2', { id: 'log-h' }, 'Log'), progress, logBox),
  ]);

  const showRecord = (current) => {
    clear(summary);
    const activeNow = environment.version === current.version;
    append(summary, [
      current.status === 'failed' ? h('div', { class: 'error', role: 'alert' },
        h('p', {}, h('strong', {}, 'The build failed:')),
        h('pre', { class: 'reason', id: 'build-error' }, current.error || 'no reason was given'),
        h('p', {}, 'Nothing changed: the previous active version stays active.')) : null,
      current.status === 'ready' ? notice(activeNow ? `Version ${current.version} is ready and active.` : `Version ${current.version} is ready.`, 'ok') : null,
      h('div', { class: 'grid' },
        h('section', { class: 'card', 'aria-labelledby': 'outcome-h' },
          h('h2', { id: 'outcome-h' }, 'Outcome'),
          h('dl', { class: 'facts', id: 'build-facts' },
            h('dt', {}, 'Status'), h('dd', { id: 'build-status' }, buildStatus(current)),
            h('dt', {}, 'Size'), h('dd', {}, current.status === 'ready' ? bytes(current.size) : '—'),
            h('dt', {}, 'Packages'), h('dd', {}, String(current.packages.length)),
            h('dt', {}, 'Toolchains'), h('dd', {}, toolchainList(current.toolchains)),
            h('dt', {}, 'Queued'), h('dd', {}, time(current.queued_at)),
            h('dt', {}, 'Started'), h('dd', {}, time(current.started_at)),
            h('dt', {}, 'Finished'), h('dd', {}, time(current.finished_at)),
            h('dt', {}, 'Took'), h('dd', {}, current.finished_at && current.started_at ? duration(current.finished_at - current.started_at) : '—'),
            h('dt', {}, 'Clean'), h('dd', {}, current.clean ? 'yes: nothing reused' : 'no'),
            h('dt', {}, 'Attempts'), h('dd', {}, String(current.attempt)))),
        h('section', { class: 'card', 'aria-labelledby': 'pk-h' },
          h('h2', { id: 'pk-h' }, 'Packages installed'), packagesTable(current.packages))),
    ]);
  };
  showRecord(record);

  if (record.status !== 'building') {
    logBox.textContent = record.log || '(empty log)';
    return;
  }
  const started = Date.now();
  const ticker = h('span', {});
  append(progress, [spinner(' Building… '), ticker]);
  const tick = setInterval(() => { ticker.textContent = `${duration(Date.now() - started)} so far`; }, 1000);
  context.onLeave(() => clearInterval(tick));
  let offset = 0;
  let final = record;
  try {
    for (let attempt = 0; attempt < 100; attempt += 1) {
      try {
        const response = await api('GET', `/v1/environments/${id}/builds/${record.version}/log${query({ follow: 'true', offset: offset || undefined })}`,
          { raw: true, signal: context.signal });
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        for (;;) {
          const { done, value } = await reader.read();
          if (done) break;
          offset += value.byteLength;
          const nearBottom = logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 40;
          logBox.append(decoder.decode(value, { stream: true }));
          if (nearBottom) logBox.scrollTop = logBox.scrollHeight;
        }
      } catch (error) {
        if (error.name === 'AbortError') throw error;
        if (error.status) throw error;
        // The stream was cut: ask again from the bytes we have.
      }
      final = await api('GET', `/v1/environments/${id}/builds/${record.version}`, { signal: context.signal });
      if (final.status !== 'building') break;
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  } finally {
    clearInterval(tick);
  }
  clear(progress);
  if (!logBox.textContent) logBox.textContent = final.log || '(empty log)';
  const fresh = await api('GET', `/v1/environments/${id}`, { signal: context.signal });
  environment.version = fresh.version;
  showRecord(final);
  append(progress, h('p', { id: 'build-done', class: 'muted' }, `The build ended: ${final.status}.`));
}

export async function versionsView(root, { id }, context) {
  const [environment, versions] = await Promise.all([
    api('GET', `/v1/environments/${id}`, { signal: context.signal }),
    listAll(`/v1/environments/${id}/versions`),
  ]);
  const list = versions.items;
  const active = versions.page.active;
  const errors = h('div', { 'aria-live': 'polite' });

  const activateCell = (v) => {
    if (v.active) return h('strong', {}, 'active');
    if (v.status !== 'ready') return '—';
    const wrap = h('span', {});
    const ask = h('button', { type: 'button', dataset: { version: String(v.version) } }, `Activate v${v.version}…`);
    ask.addEventListener('click', () => {
      clear(wrap);
      const yes = actionButton(`Yes, make v${v.version} active`, async () => {
        await api('POST', `/v1/environments/${id}/versions/${v.version}/activate`);
        context.rerender();
      }, { kind: 'primary', busyLabel: 'Activating…', errorTarget: errors });
      const no = h('button', { type: 'button', onclick: () => { clear(wrap); wrap.append(ask); ask.focus(); } }, 'Cancel');
      append(wrap, [h('span', { class: 'muted' }, `New sessions will read v${v.version}${active ? ` instead of v${active}` : ''}. `), yes, ' ', no]);
      yes.focus();
    });
    wrap.append(ask);
    return wrap;
  };

  const rows = list.map((v) => [
    link(`#/environments/${id}/builds/${v.version}`, `v${v.version}`),
    v.status === 'building' ? badge('building', v.phase) : badge(v.status),
    activateCell(v),
    String(v.packages),
    toolchainList(v.toolchains),
    time(v.started_at),
    time(v.finished_at),
  ]);

  const ready = list.filter((v) => v.status === 'ready').map((v) => v.version);
  const from = h('select', { id: 'diff-from' }, ready.map((n) => h('option', { value: String(n) }, `v${n}`)));
  const to = h('select', { id: 'diff-to' }, ready.map((n) => h('option', { value: String(n) }, `v${n}`)));
  if (ready.length >= 2) {
    from.value = String(ready[1]);
    to.value = String(ready[0]);
  }
  const compare = h('form', { class: 'inline-form', 'aria-labelledby': 'diff-h' },
    field('From', from), field('To', to), h('button', { type: 'submit' }, 'Compare'));
  compare.addEventListener('submit', (event) => {
    event.preventDefault();
    context.navigate(`#/environments/${id}/diff/${from.value}/${to.value}`);
  });

  append(root, [
    breadcrumb(['Environments', '#/environments'], [environment.name, `#/environments/${id}`], ['Builds & versions']),
    heading(`Versions of ${environment.name}`),
    envTabs(id, 'versions'),
    h('section', { class: 'card', 'aria-labelledby': 'vers-h' },
      h('h2', { id: 'vers-h' }, 'Versions'),
      h('p', {}, 'Rolling back is activating an older version: nothing is rebuilt, and sessions already running keep the version they started on.'),
      errors,
      list.length ? table(['Version', 'Status', 'Active', 'Packages', 'Toolchains', 'Started', 'Finished'], rows, 'Newest first')
        : h('p', { class: 'empty' }, 'Nothing built yet.'),
      h('p', { class: 'actions' }, actionButton('Start a build', async () => {
        const record = await api('POST', `/v1/environments/${id}/build`);
        context.navigate(`#/environments/${id}/builds/${record.version}`);
      }, { busyLabel: 'Starting…', errorTarget: errors }))),
    h('section', { class: 'card', 'aria-labelledby': 'diff-h' },
      h('h2', { id: 'diff-h' }, 'Compare two versions'),
      ready.length >= 2 ? compare : h('p', { class: 'empty' }, 'Two ready versions are needed to compare.')),
  ]);
}

/** Compares dotted versions numerically where they are numbers: <0, 0 or >0. */
function compareVersions(a, b) {
  const pa = String(a).split(/[.+-]/);
  const pb = String(b).split(/[.+-]/);
  for (let i = 0; i < Math.max(pa.length, pb.length); i += 1) {
    const x = pa[i] ?? '';
    const y = pb[i] ?? '';
    const nx = /^\d+$/.test(x) ? Number(x) : NaN;
    const ny = /^\d+$/.test(y) ? Number(y) : NaN;
    if (!Number.isNaN(nx) && !Number.isNaN(ny)) {
      if (nx !== ny) return nx - ny;
    } else if (x !== y) {
      return x < y ? -1 : 1;
    }
  }
  return 0;
}

export function diffPackages(before, after) {
  const key = (p) => `${p.manager}:${p.name.toLowerCase()}`;
  const old = new Map(before.map((p) => [key(p), p]));
  const now = new Map(after.map((p) => [key(p), p]));
  const added = after.filter((p) => !old.has(key(p)));
  const removed = before.filter((p) => !now.has(key(p)));
  const changed = after.filter((p) => old.has(key(p)) && old.get(key(p)).version !== p.version)
    .map((p) => ({ ...p, from: old.get(key(p)).version, direction: compareVersions(p.version, old.get(key(p)).version) > 0 ? 'upgraded' : 'downgraded' }));
  return { added, removed, changed };
}

export function diffFiles(before, after) {
  const files = (list) => new Map(list.filter((e) => e.type === 'file').map((e) => [e.path, e]));
  const old = files(before);
  const now = files(after);
  const added = [...now.values()].filter((e) => !old.has(e.path));
  const removed = [...old.values()].filter((e) => !now.has(e.path));
  const changed = [...now.values()].filter((e) => old.has(e.path)
    && (old.get(e.path).digest !== e.digest || old.get(e.path).executable !== e.executable))
    .map((e) => ({ ...e, before: old.get(e.path) }));
  return { added, removed, changed };
}

/**
 * The files of one version, when the server lists them. The REST API lists only the current
 * source (`GET …/files`); a version's tree would be `GET …/versions/{n}/files`, paged and
 * shaped like it. The console asks only when the server's OpenAPI document offers it.
 */
async function versionFiles(id, version) {
  if (!(await offers('get', VERSION_FILES))) return null;
  return (await listAll(`/v1/environments/${id}/versions/${version}/files`)).items;
}

export async function diffView(root, { id, from, to }, context) {
  const [environment, before, after] = await Promise.all([
    api('GET', `/v1/environments/${id}`, { signal: context.signal }),
    api('GET', `/v1/environments/${id}/builds/${encodeURIComponent(from)}`, { signal: context.signal }),
    api('GET', `/v1/environments/${id}/builds/${encodeURIComponent(to)}`, { signal: context.signal }),
  ]);
  append(root, [
    breadcrumb(['Environments', '#/environments'], [environment.name, `#/environments/${id}`],
      ['Builds & versions', `#/environments/${id}/versions`], [`v${from} → v${to}`]),
    heading(`Version ${from} → version ${to}`),
    envTabs(id, 'versions'),
  ]);

  const filesCard = h('section', { class: 'card', 'aria-labelledby': 'df-h', id: 'diff-files' }, h('h2', { id: 'df-h' }, 'Files'));
  const pkgCard = h('section', { class: 'card', 'aria-labelledby': 'dp-h', id: 'diff-packages' }, h('h2', { id: 'dp-h' }, 'Packages'));
  append(root, [filesCard, pkgCard]);

  // Packages: from each build's record.
  const packages = diffPackages(before.packages || [], after.packages || []);
  const pkgRows = [
    ...packages.added.map((p) => [p.name, badge('added'), '—', p.version, p.manager]),
    ...packages.removed.map((p) => [p.name, badge('removed'), p.version, '—', p.manager]),
    ...packages.changed.map((p) => [p.name, badge(p.direction), p.from, p.version, p.manager]),
  ];
  append(pkgCard, pkgRows.length ? table(['Package', 'Change', `v${from}`, `v${to}`, 'Manager'], pkgRows)
    : h('p', { class: 'empty' }, `Same packages (${after.packages.length}).`));

  // Files: from each version's tree, when the server lists one.
  const loading = spinner(' Comparing files…');
  filesCard.append(loading);
  let trees;
  try {
    trees = await Promise.all([versionFiles(id, from), versionFiles(id, to)]);
  } catch (error) {
    loading.remove();
    append(filesCard, errorBox(error));
    return;
  }
  loading.remove();
  if (!trees[0] || !trees[1]) {
    append(filesCard, h('div', { class: 'notice notice-warn', role: 'status', id: 'diff-files-unavailable' },
      h('p', {}, 'This server does not list the files of a version, so the files cannot be compared here. '
        + 'Its API lists only the current source (GET …/files).'),
      h('p', {}, 'What the comparison needs: ', h('code', {}, `GET ${VERSION_FILES}`),
        ', answering the same paged list as the source tree (path, type, size, digest, executable).')));
    return;
  }
  const files = diffFiles(trees[0], trees[1]);
  const fileHref = (path) => `#/environments/${id}/files/${encodePath(path)}`;
  const rows = [
    ...files.added.map((e) => [e.path, badge('added'), '—', bytes(e.size)]),
    ...files.removed.map((e) => [e.path, badge('removed'), bytes(e.size), '—']),
    ...files.changed.map((e) => [link(fileHref(e.path), e.path), badge('changed'), bytes(e.before.size), bytes(e.size)]),
  ];
  append(filesCard, rows.length
    ? [h('p', {}, `${files.added.length} added, ${files.removed.length} removed, ${files.changed.length} changed.`),
      table(['Path', 'Change', `v${from}`, `v${to}`], rows)]
    : h('p', { class: 'empty' }, 'The two versions hold the same files.'));
}
