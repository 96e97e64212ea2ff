// The scope's harnesses (each names the environment its tasks run in) and its usage of each
// quota.

import { api, listAll, query } from './api.js';
import { h, append, time, bytes, heading, table, link } from './ui.js';

export async function harnessesView(root, _params, context) {
  const after = context.query.get('after') || undefined;
  const [page, environments] = await Promise.all([
    api('GET', `/v1/harnesses${query({ limit: 50, after })}`, { signal: context.signal }),
    listAll('/v1/environments', {}, 1000).then((r) => r.items),
  ]);
  const names = new Map(environments.map((e) => [e.id, e]));
  const rows = page.data.map((harness) => {
    const environment = names.get(harness.environment);
    return [
      harness.name,
      harness.base,
      environment ? link(`#/environments/${environment.id}`, environment.name)
        : h('span', { class: 'muted' }, `${harness.environment} (deleted: its tasks are refused)`),
      environment && environment.version !== null ? `v${environment.version}` : '—',
      time(harness.updatedAt),
      h('code', {}, harness.id),
    ];
  });
  append(root, [
    heading('Harnesses'),
    h('p', {}, 'A harness names the environment its tasks run in: a rebuild of that environment reaches every task started through it.'),
    rows.length ? table(['Harness', 'Base', 'Environment', 'Its active version', 'Updated', 'Id'], rows, 'Oldest first')
      : h('p', { class: 'empty' }, 'No harnesses in this scope.'),
    page.has_more && page.next ? h('nav', { class: 'pager', 'aria-label': 'Pages' },
      link(`#/harnesses?${new URLSearchParams({ after: page.next })}`, 'Next page →')) : null,
  ]);
}

const QUOTAS = [
  ['environments', 'Environments', (n) => String(n)],
  ['stored_bytes', 'Stored bytes', bytes],
  ['sessions', 'Active sessions', (n) => String(n)],
  ['queued_builds', 'Builds queued or running', (n) => String(n)],
];

export async function usageView(root, _params, context) {
  const usage = await api('GET', '/v1/usage', { signal: context.signal });
  const cards = QUOTAS.map(([key, label, show]) => {
    const quota = usage.quotas[key] || { used: 0, limit: 0 };
    const meter = h('meter', {
      min: '0', max: String(Math.max(quota.limit, 1)), value: String(Math.min(quota.used, Math.max(quota.limit, 1))),
      high: String(Math.max(quota.limit, 1) * 0.8), optimum: '0', id: `meter-${key}`,
    });
    const percent = quota.limit ? Math.round((quota.used / quota.limit) * 100) : null;
    return h('section', { class: 'card quota' },
      h('h2', {}, h('label', { for: meter.id }, label)),
      meter,
      h('p', {}, `${show(quota.used)} of ${show(quota.limit)}`, percent === null ? ' (none allowed)' : ` (${percent}%)`));
  });
  append(root, [
    heading('Usage and quotas'),
    h('p', {}, 'Scope ', h('code', {}, usage.scope), '. A create that would pass a quota is refused (429 quota_exceeded); ask the operator for a higher one.'),
    h('div', { class: 'grid quotas' }, cards),
  ]);
}
