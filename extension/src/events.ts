/**
 * The fleet's event stream, live: one websocket to the server extension for every kernel of this
 * Jupyter server, reconnecting by itself with exponential backoff (0.5 s doubling to 10 s).
 * Reconnecting passes `since` (the last `seq` seen), so no event the gateway still holds is missed.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { IFleetEvent, eventsUrl } from './api';

const FIRST_RETRY_MS = 500;
const LAST_RETRY_MS = 10_000;

export class EventStream {
  /** A fleet event, in `seq` order. */
  get received(): ISignal<this, IFleetEvent> {
    return this._received;
  }

  /** `true` when the stream (re)opened, `false` when it closed or could not open. */
  get connectionChanged(): ISignal<this, boolean> {
    return this._connectionChanged;
  }

  get connected(): boolean {
    return this._socket !== null && this._socket.readyState === WebSocket.OPEN;
  }

  start(): void {
    this._stopped = false;
    this._open();
  }

  dispose(): void {
    this._stopped = true;
    window.clearTimeout(this._timer);
    this._socket?.close();
    this._socket = null;
  }

  private _open(): void {
    const socket = new WebSocket(eventsUrl(this._lastSeq));
    this._socket = socket;
    socket.onopen = () => {
      this._delay = FIRST_RETRY_MS;
      this._connectionChanged.emit(true);
    };
    socket.onmessage = message => {
      // The backlog holds only events after `since`; a restarted gateway numbers from 1 again,
      // so every event is taken and the latest seq remembered, whatever it is.
      const event = JSON.parse(String(message.data)) as IFleetEvent;
      this._lastSeq = event.seq;
      this._received.emit(event);
    };
    socket.onclose = () => {
      if (this._socket !== socket) {
        return;
      }
      this._socket = null;
      this._connectionChanged.emit(false);
      if (!this._stopped) {
        this._timer = window.setTimeout(() => this._open(), this._delay);
        this._delay = Math.min(this._delay * 2, LAST_RETRY_MS);
      }
    };
  }

  private _socket: WebSocket | null = null;
  private _lastSeq: number | null = null;
  private _delay = FIRST_RETRY_MS;
  private _timer = 0;
  private _stopped = true;
  private _received = new Signal<this, IFleetEvent>(this);
  private _connectionChanged = new Signal<this, boolean>(this);
}
