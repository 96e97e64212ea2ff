// An environment's source: its tree, one file (read, edit, save with If-Match), uploads, and
// imports of an archive (drag and drop or a picker) or a git repository.

import { api, listAll, upload, encodePath, query } from './api.js';
import {
  h, append, clear, bytes, count, errorBox, field, heading, link, notice, actionButton, spinner,
} from './ui.js';
import { envTabs, breadcrumb } from './environments.js';

/** Largest file the console shows and edits as text. */
const MAX_TEXT = 2 * 1024 * 1024;

export async function filesView(root, { id, path }, context) {
  const [environment, tree] = await Promise.all([
    api('GET', `/v1/environments/${id}`, { signal: context.signal }),
    listAll(`/v1/environments/${id}/files`),
  ]);
  const entries = tree.items;
  const crumbs = [['Environments', '#/environments'], [environment.name, `#/environments/${id}`]];
  append(root, [
    breadcrumb(...crumbs, path ? ['Files', `#/environments/${id}/files`] : ['Files'], ...(path ? [[path]] : [])),
    heading(path ? path : `Files of ${environment.name}`),
    envTabs(id, 'files'),
  ]);
  const layout = h('div', { class: 'files-layout' });
  const treePane = h('section', { class: 'card tree-pane', 'aria-labelledby': 'tree-h' },
    h('h2', { id: 'tree-h' }, 'Source'),
    h('p', { class: 'muted' }, `${count(environment.files.count, 'file')}, ${bytes(environment.files.bytes)}. `
      + 'Changes reach sessions at the next build.'),
    renderTree(id, entries, path));
  const side = h('div', { class: 'files-side' });
  append(layout, [treePane, side]);
  append(root, layout);
  if (path) {
    const entry = entries.find((e) => e.path === path);
    if (entry && entry.type === 'directory') {
      append(side, directoryCard(id, entry, entries));
    } else {
      await fileEditor(side, id, path, context);
    }
  }
  append(side, [uploadCard(id, path, entries, context), importCard(id, context)]);
}

/** The tree as nested lists; directories are disclosure widgets, open on the way to `current`. */
function renderTree(id, entries, current) {
  if (!entries.length) {
    return h('p', { class: 'empty' }, 'The source is empty: upload files or import an archive.');
  }
  const rootList = h('ul', { class: 'tree', role: 'list' });
  const lists = new Map([['', rootList]]);
  for (const entry of entries) {
    const slash = entry.path.lastIndexOf('/');
    const parent = slash < 0 ? '' : entry.path.slice(0, slash);
    const name = slash < 0 ? entry.path : entry.path.slice(slash + 1);
    const list = lists.get(parent) || rootList;
    const href = `#/environments/${id}/files/${encodePath(entry.path)}`;
    if (entry.type === 'directory') {
      const children = h('ul', { role: 'list' });
      lists.set(entry.path, children);
      const open = current === entry.path || (current || '').startsWith(`${entry.path}/`) || entries.length < 60;
      list.append(h('li', {}, h('details', { open },
        h('summary', {}, h('span', { class: 'dir' }, `${name}/`), ' ', h('span', { class: 'muted' }, bytes(entry.size))),
        children)));
    } else {
      list.append(h('li', {}, link(href, name, {
        class: 'file', 'aria-current': current === entry.path ? 'page' : null,
      }), ' ', h('span', { class: 'muted' }, bytes(entry.size)), entry.executable ? h('span', { class: 'muted' }, ' · executable') : null));
    }
  }
  return rootList;
}

function directoryCard(id, entry, entries) {
  const inside = entries.filter((e) => e.path.startsWith(`${entry.path}/`) && !e.path.slice(entry.path.length + 1).includes('/'));
  return h('section', { class: 'card' },
    h('h2', {}, `${entry.path}/`),
    h('p', {}, `${bytes(entry.size)} beneath it.`),
    h('ul', {}, inside.map((e) => h('li', {}, link(`#/environments/${id}/files/${encodePath(e.path)}`, e.path.slice(entry.path.length + 1) + (e.type === 'directory' ? '/' : ''))))));
}

/** Shows one file; text files can be edited and saved with If-Match: the ETag read. */
async function fileEditor(side, id, path, context) {
  const card = h('section', { class: 'card editor', 'aria-labelledby': 'file-h' });
  append(side, card);
  const url = `/v1/environments/${id}/files/${encodePath(path)}`;
  let response;
  try {
    response = await api('GET', url, { raw: true, signal: context.signal });
  } catch (error) {
    append(card, [h('h2', { id: 'file-h' }, path), errorBox(error)]);
    return;
  }
  let etag = response.headers.get('ETag');
  const buffer = await response.arrayBuffer();
  const status = h('div', { 'aria-live': 'polite', class: 'save-status' });
  const download = h('button', { type: 'button' }, 'Download');
  download.addEventListener('click', () => {
    const blob = new Blob([buffer], { type: 'application/octet-stream' });
    const anchor = h('a', { href: URL.createObjectURL(blob), download: path.split('/').pop() });
    document.body.append(anchor);
    anchor.click();
    anchor.remove();
    setTimeout(() => URL.revokeObjectURL(anchor.href), 10000);
  });
  const remove = deleteButton(id, path, context);
  append(card, [
    h('h2', { id: 'file-h' }, path),
    h('p', { class: 'muted' }, `${bytes(buffer.byteLength)} · ETag `, h('code', { class: 'etag' }, etag || '—')),
  ]);
  let text = null;
  if (buffer.byteLength <= MAX_TEXT) {
    try {
      text = new TextDecoder('utf-8', { fatal: true }).decode(buffer);
      if (text.includes('\u0000')) text = null;
    } catch {
      text = null;
    }
  }
  if (text === null) {
    append(card, [
      notice(buffer.byteLength > MAX_TEXT ? 'This file is too large to edit here.' : 'This file is not UTF-8 text; it can be downloaded or replaced by an upload.'),
      h('p', { class: 'actions' }, download, remove),
    ]);
    return;
  }
  const area = h('textarea', {
    id: 'file-content', class: 'code', spellcheck: 'false', rows: String(Math.min(30, Math.max(8, text.split('\n').length + 2))),
  });
  area.value = text;
  const save = h('button', { type: 'button', class: 'primary' }, 'Save');
  const dirty = () => area.value !== text;
  area.addEventListener('input', () => {
    clear(status);
    if (dirty()) append(status, h('span', { class: 'muted' }, 'Unsaved changes.'));
  });
  const reload = () => context.rerender();
  save.addEventListener('click', async () => {
    clear(status);
    save.disabled = true;
    save.textContent = 'Saving…';
    try {
      const headers = { 'Content-Type': 'application/octet-stream' };
      if (etag) headers['If-Match'] = etag;
      const written = await api('PUT', url, { body: new TextEncoder().encode(area.value), headers, raw: true });
      const entry = await written.json();
      etag = written.headers.get('ETag') || (entry.digest ? `"${entry.digest}"` : etag);
      text = area.value;
      card.querySelector('.etag').textContent = etag;
      append(status, notice(`Saved (${bytes(entry.size)}). Build to make it reach sessions.`, 'ok'));
    } catch (error) {
      if (error.status === 412) {
        const reloadButton = h('button', { type: 'button', onclick: reload }, 'Reload the file (drops your edits)');
        const copyButton = h('button', {
          type: 'button',
          onclick: async () => {
            try {
              await navigator.clipboard.writeText(area.value);
              copyButton.textContent = 'Copied';
            } catch {
              area.select();
            }
          },
        }, 'Copy my version');
        append(status, [
          h('div', { class: 'conflict', role: 'alert' },
            h('h3', {}, 'Not saved: the file changed since you opened it'),
            h('p', {}, 'Someone (or something) wrote this file after you read it, so saving would '
              + 'overwrite their change. Nothing was written. Copy your version if you need it, '
              + 'reload the file to see theirs, then make your edit again and save.'),
            errorBox(error, reloadButton, copyButton)),
        ]);
      } else {
        append(status, errorBox(error));
      }
    } finally {
      save.disabled = false;
      save.textContent = 'Save';
    }
  });
  append(card, [
    h('label', { for: 'file-content' }, 'Contents'),
    area,
    status,
    h('p', { class: 'actions' }, save, download, remove),
  ]);
}

function deleteButton(id, path, context) {
  const wrap = h('span', {});
  const ask = h('button', { type: 'button', class: 'danger' }, 'Delete…');
  ask.addEventListener('click', () => {
    ask.hidden = true;
    const errors = h('span', {});
    const yes = actionButton(`Delete ${path}`, async () => {
      await api('DELETE', `/v1/environments/${id}/files/${encodePath(path)}`);
      context.navigate(`#/environments/${id}/files`);
    }, { kind: 'danger', errorTarget: errors });
    const no = h('button', { type: 'button', onclick: () => { clear(wrap); wrap.append(ask); ask.hidden = false; ask.focus(); } }, 'Cancel');
    clear(wrap);
    append(wrap, [yes, no, errors]);
    yes.focus();
  });
  wrap.append(ask);
  return wrap;
}

function progressLine(label) {
  const bar = h('progress', { max: '100', value: '0' });
  const text = h('span', {}, label);
  const line = h('div', { class: 'progress-line', role: 'status' }, text, bar);
  return {
    line,
    set(sent, total) {
      if (total) {
        bar.max = total;
        bar.value = sent;
        text.textContent = `${label} ${bytes(sent)} of ${bytes(total)}`;
      }
    },
    done(message) {
      bar.remove();
      text.textContent = message;
    },
  };
}

function uploadCard(id, current, entries, context) {
  const here = current && entries.some((e) => e.path === current && e.type === 'directory') ? current
    : current && current.includes('/') ? current.slice(0, current.lastIndexOf('/')) : '';
  const folder = h('input', { type: 'text', value: here, autocomplete: 'off', spellcheck: 'false', placeholder: 'src/' });
  const files = h('input', { type: 'file', multiple: true });
  const executable = h('input', { type: 'checkbox', id: 'upload-exec' });
  const output = h('div', { 'aria-live': 'polite' });
  const button = h('button', { type: 'submit' }, 'Upload');
  const form = h('form', { class: 'card', 'aria-labelledby': 'upload-h' },
    h('h2', { id: 'upload-h' }, 'Upload files'),
    field('Into folder (empty: the root)', folder),
    field('Files', files, 'A file already at that path is replaced.'),
    h('div', { class: 'check' }, executable, h('label', { for: 'upload-exec' }, 'Mark executable')),
    output,
    h('p', { class: 'actions' }, button));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(output);
    if (!files.files.length) {
      append(output, notice('Choose one or more files first.', 'warn'));
      files.focus();
      return;
    }
    button.disabled = true;
    const prefix = folder.value.trim().replace(/^\/+|\/+$/g, '');
    let last = '';
    try {
      for (const file of files.files) {
        const target = prefix ? `${prefix}/${file.name}` : file.name;
        const progress = progressLine(`Uploading ${target}:`);
        append(output, progress.line);
        await upload('PUT', `/v1/environments/${id}/files/${encodePath(target)}${query({ executable: executable.checked ? 'true' : '' })}`, file, {
          headers: { 'Content-Type': 'application/octet-stream' },
          onProgress: progress.set,
        });
        progress.done(`Uploaded ${target}.`);
        last = target;
      }
      context.navigate(`#/environments/${id}/files/${encodePath(last)}`);
    } catch (error) {
      append(output, errorBox(error));
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

function importCard(id, context) {
  const output = h('div', { 'aria-live': 'polite' });
  const replace = h('input', { type: 'checkbox', id: 'import-replace', checked: true });
  const picker = h('input', { type: 'file', id: 'import-file', accept: '.zip,.tar,.tar.gz,.tgz,.tar.bz2,.tar.xz,.tar.zst,application/zip,application/x-tar,application/gzip' });
  const zone = h('div', { class: 'dropzone', id: 'dropzone' },
    h('p', {}, h('strong', {}, 'Drop a zip or tar archive here'), ' or ', h('label', { for: 'import-file', class: 'as-link' }, 'choose one'), '.'),
    picker);
  let busy = false;
  const send = async (file) => {
    if (busy) return;
    busy = true;
    clear(output);
    const progress = progressLine(`Sending ${file.name}:`);
    append(output, progress.line);
    try {
      const type = file.type && file.type !== 'application/json' ? file.type : 'application/octet-stream';
      const report = await upload('POST', `/v1/environments/${id}/import${query({ replace: replace.checked ? 'true' : '' })}`, file, {
        headers: { 'Content-Type': type },
        onProgress: (sent, total) => {
          progress.set(sent, total);
          if (sent >= total) progress.done(`Sent ${bytes(total)}; the server is unpacking it…`);
        },
      });
      progress.done('Imported.');
      append(output, importReport(report, id, context));
    } catch (error) {
      progress.done('The import failed.');
      append(output, errorBox(error));
    } finally {
      busy = false;
      picker.value = '';
    }
  };
  picker.addEventListener('change', () => {
    if (picker.files.length) send(picker.files[0]);
  });
  for (const name of ['dragenter', 'dragover']) {
    zone.addEventListener(name, (event) => {
      event.preventDefault();
      zone.classList.add('dragging');
    });
  }
  zone.addEventListener('dragleave', () => zone.classList.remove('dragging'));
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    zone.classList.remove('dragging');
    const file = event.dataTransfer && event.dataTransfer.files[0];
    if (file) send(file);
  });

  const url = h('input', { type: 'url', placeholder: 'https://github.com/owner/repo', autocomplete: 'off', spellcheck: 'false' });
  const ref = h('input', { type: 'text', placeholder: 'main', autocomplete: 'off', spellcheck: 'false' });
  const gitOut = h('div', { 'aria-live': 'polite' });
  const gitButton = h('button', { type: 'submit' }, 'Import from git');
  const gitForm = h('form', { class: 'git-form' },
    h('h3', {}, 'From a git repository'),
    field('Repository URL', url),
    field('Branch, tag or commit (optional)', ref, 'Left empty: the default branch.'),
    gitOut,
    h('p', { class: 'actions' }, gitButton));
  gitForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(gitOut);
    if (!url.value.trim()) {
      append(gitOut, notice('Give the repository URL.', 'warn'));
      url.focus();
      return;
    }
    gitButton.disabled = true;
    append(gitOut, spinner(' Fetching the repository…'));
    try {
      const git = { url: url.value.trim() };
      if (ref.value.trim()) git.ref = ref.value.trim();
      const report = await api('POST', `/v1/environments/${id}/import`, { json: { git, replace: replace.checked } });
      clear(gitOut);
      append(gitOut, importReport(report, id, context));
    } catch (error) {
      clear(gitOut);
      append(gitOut, errorBox(error));
    } finally {
      gitButton.disabled = false;
    }
  });

  return h('section', { class: 'card', 'aria-labelledby': 'import-h' },
    h('h2', { id: 'import-h' }, 'Import'),
    h('div', { class: 'check' }, replace, h('label', { for: 'import-replace' }, 'Replace: clear the source first (otherwise files land over what is there)')),
    zone, output, gitForm);
}

function importReport(report, id, context) {
  const skipped = Object.entries(report.skipped_by_reason || {}).map(([why, n]) => `${n} ${why}`).join(', ');
  return h('div', { class: 'notice notice-ok', role: 'status' },
    h('p', {}, `Imported ${count(report.files, 'file')} and ${report.directories} ${report.directories === 1 ? 'directory' : 'directories'} (${bytes(report.bytes)})`
      + `${report.symlinks ? `, ${report.symlinks} links kept` : ''}`
      + `${report.skipped ? `; ${report.skipped} skipped (${skipped})` : ''}`
      + `${report.stripped_wrapper ? '; the wrapping directory was stripped' : ''}.`),
    report.commit ? h('p', {}, 'Commit ', h('code', {}, report.commit), report.describe ? ` (${report.describe})` : '') : null,
    (report.warnings || []).map((w) => h('p', {}, `Warning: ${w}`)),
    h('p', { class: 'actions' },
      h('button', { type: 'button', onclick: () => context.navigate(`#/environments/${id}/files`) }, 'Show the files'),
      h('button', { type: 'button', onclick: () => context.navigate(`#/environments/${id}`) }, 'Go to build')));
}

