// Calls to the Plinth REST API on this origin (`/v1/...`). The token, when there is one,
// lives in sessionStorage and goes as `Authorization: Bearer`; no cookie is ever used.

const TOKEN_KEY = 'plinth.console.token';
const NOTICE_KEY = 'plinth.console.notice';

/** An error answer of the API: `{"error": {"code", "message", "detail"?}}`. */
export class ApiError extends Error {
  constructor(status, code, message, detail, headers) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.headers = headers;
  }
}

export const auth = {
  /** Whether the viewer has signed in, with a token or with none. */
  signedIn() {
    return sessionStorage.getItem(TOKEN_KEY) !== null;
  },
  /** The token, '' when signed in without one, null when not signed in. */
  token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  signIn(token) {
    sessionStorage.setItem(TOKEN_KEY, token);
  },
  signOut(notice) {
    sessionStorage.removeItem(TOKEN_KEY);
    if (notice) {
      sessionStorage.setItem(NOTICE_KEY, notice);
    }
  },
  /** A message left for the sign-in page (why the viewer was signed out), read once. */
  takeNotice() {
    const notice = sessionStorage.getItem(NOTICE_KEY);
    sessionStorage.removeItem(NOTICE_KEY);
    return notice;
  },
};

let onUnauthenticated = () => {};

/** What to do when the API answers 401: sign out and show the sign-in page. */
export function setUnauthenticatedHandler(handler) {
  onUnauthenticated = handler;
}

export function authHeaders() {
  const token = auth.token();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** `a/b c/d` → `a/b%20c/d`: each segment encoded, slashes kept. */
export function encodePath(path) {
  return path.split('/').map(encodeURIComponent).join('/');
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '' && value !== false) {
      search.set(key, String(value));
    }
  }
  const text = search.toString();
  return text ? `?${text}` : '';
}

/** Turns a non-2xx response into an ApiError, reading the API's error body when it has one. */
export async function errorOf(response) {
  let code = `http_${response.status}`;
  let message = `${response.status} ${response.statusText || 'error'}`;
  let detail;
  try {
    const body = await response.json();
    if (body && body.error) {
      code = body.error.code || code;
      message = body.error.message || message;
      detail = body.error.detail;
    }
  } catch {
    // Not JSON: keep the status line.
  }
  const error = new ApiError(response.status, code, message, detail, response.headers);
  if (response.status === 401) {
    auth.signOut(message);
    onUnauthenticated(error);
  }
  return error;
}

/**
 * One API call. `json` sends a JSON body; `body` sends bytes as they are. Answers the parsed
 * JSON, or the Response itself with `raw: true`.
 */
export async function api(method, path, options = {}) {
  const headers = { ...authHeaders(), ...(options.headers || {}) };
  let body = options.body;
  if (options.json !== undefined) {
    headers['Content-Type'] = 'application/json';
    body = JSON.stringify(options.json);
  }
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body,
      signal: options.signal,
      credentials: 'omit',
      cache: 'no-store',
    });
  } catch (cause) {
    if (cause && cause.name === 'AbortError') {
      throw cause;
    }
    throw new ApiError(0, 'network', `the server could not be reached (${cause.message})`);
  }
  if (!response.ok) {
    throw await errorOf(response);
  }
  if (options.raw) {
    return response;
  }
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

/** Every item of a paged list (`limit`, `after`, `has_more`, `next`), up to `max` items. */
export async function listAll(path, params = {}, max = 10000) {
  const items = [];
  let after;
  for (;;) {
    const page = await api('GET', path + query({ ...params, limit: 1000, after }));
    items.push(...page.data);
    if (!page.has_more || !page.next || items.length >= max) {
      return { items, page };
    }
    after = page.next;
  }
}

/**
 * Sends bytes with upload progress (fetch has none): `onProgress(sent, total)`. Answers the
 * parsed JSON; errors are ApiErrors as for `api`.
 */
export function upload(method, path, blob, { headers = {}, onProgress } = {}) {
  return new Promise((resolve, reject) => {
    const request = new XMLHttpRequest();
    request.open(method, path);
    request.withCredentials = false;
    for (const [key, value] of Object.entries({ ...authHeaders(), ...headers })) {
      request.setRequestHeader(key, value);
    }
    request.responseType = 'text';
    if (onProgress) {
      request.upload.addEventListener('progress', (event) => {
        onProgress(event.loaded, event.lengthComputable ? event.total : blob.size);
      });
    }
    request.addEventListener('load', async () => {
      if (request.status >= 200 && request.status < 300) {
        resolve(request.responseText ? JSON.parse(request.responseText) : null);
        return;
      }
      const response = new Response(request.responseText, {
        status: request.status,
        statusText: request.statusText,
      });
      reject(await errorOf(response));
    });
    request.addEventListener('error', () => {
      reject(new ApiError(0, 'network', 'the upload was cut off: the server could not be reached'));
    });
    request.addEventListener('abort', () => {
      reject(new ApiError(0, 'aborted', 'the upload was cancelled'));
    });
    request.send(blob);
  });
}

let openapi = null;

/** The server's OpenAPI document (no token needed), fetched once. */
export async function apiDocument() {
  if (!openapi) {
    openapi = fetch('/openapi.json', { credentials: 'omit' })
      .then((response) => (response.ok ? response.json() : { paths: {} }))
      .catch(() => ({ paths: {} }));
  }
  return openapi;
}

/** Whether the server documents `method path` (a path as the document spells it). */
export async function offers(method, path) {
  const document = await apiDocument();
  const item = document.paths && document.paths[path];
  return Boolean(item && item[method.toLowerCase()]);
}
