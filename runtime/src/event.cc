#include <chrono>
#include <memory>
#include <mutex>

#include "axon/runtime.h"
#include "device.h"
#include "graph.h"

namespace axon::rt {

class Event {
 public:
  // One event_record: the marker task owns it too, so destroying the Event
  // while the marker is still queued is safe.  stamp is written by the
  // marker and read only after the stream reports the marker complete (the
  // stream mutex orders the two).
  struct Record {
    StreamState* stream = nullptr;
    uint64_t seq = 0;
    bool stamped = false;  // false if the marker was dropped at exit
    std::chrono::steady_clock::time_point stamp;
    // The failures pending on the stream when the marker ran: the event
    // carries them to streams that wait on it and to event_synchronize.
    FailureList failures;
    // Recorded during a capture (graph.h): no marker was enqueued; a stream
    // that waits for it joins the capture.  The position is the capture's
    // task count at the record, on stream id capture_stream.
    std::shared_ptr<Capture> capture;
    int64_t capture_stream = 0;
    size_t capture_pos = 0;

    bool complete() const { return stream->completed() >= seq; }
  };

  explicit Event(int device) : device(device) {}

  std::shared_ptr<Record> latest() {
    std::lock_guard lk(mu);
    return last;
  }

  const int device;
  std::mutex mu;
  std::shared_ptr<Record> last;  // null until recorded; re-recording replaces it
};

namespace {

Event& checked(Event* e) {
  if (e == nullptr) throw Error("axon: null event");
  return *e;
}

}  // namespace

Event* event_create(int d) {
  check_device(d);
  return new Event(d);
}

void event_destroy(Event* e) { delete e; }

int event_device(Event* e) { return checked(e).device; }

void event_record(Event* e, Stream s) {
  Event& ev = checked(e);
  StreamState& st = stream_state(s);
  if (s.device != ev.device) {
    throw Error("axon: event of axon:" + std::to_string(ev.device) +
                " recorded on a stream of axon:" + std::to_string(s.device));
  }
  auto rec = std::make_shared<Event::Record>();
  rec->stream = &st;
  if (auto c = active_capture(s)) {
    bool ended;
    {
      std::lock_guard clk(c->mu);
      ended = c->ended;  // ended meanwhile: record as usual
      rec->capture_pos = c->tasks.size();
    }
    if (!ended) {
      rec->capture = c;
      rec->capture_stream = s.id;
      std::lock_guard lk(ev.mu);
      ev.last = std::move(rec);
      return;
    }
  }
  // The marker writes only stamp/stamped, never seq, so setting seq after
  // enqueue (before publishing rec) does not race with it.
  rec->seq = st.enqueue("event_record", [rec, &st] {
    rec->failures = st.pending_failures();
    rec->stamp = std::chrono::steady_clock::now();
    rec->stamped = true;
  });
  std::lock_guard lk(ev.mu);
  ev.last = std::move(rec);
}

void stream_wait_event(Stream s, Event* e) {
  StreamState& st = stream_state(s);
  auto rec = checked(e).latest();
  if (rec && rec->capture) {
    capture_wait(s, rec->capture, rec->capture_stream, rec->capture_pos);
    return;
  }
  if (rec && !rec->complete() && rec->stream != &st) {
    if (auto c = active_capture(s)) {
      capture_violation(c, "a capturing stream waits for an event recorded outside the capture");
    }
  }
  // Same stream: already ordered (and its failures are already pending here).
  if (!rec || rec->stream == &st) return;
  // Complete: nothing to wait for, but its failures reach s at once.
  if (rec->complete()) {
    st.inherit(rec->failures);
    return;
  }
  st.enqueue("stream_wait_event", [rec, &st] {
    rec->stream->wait(rec->seq);
    st.inherit(rec->failures);
  });
}

namespace {
// An event recorded in a capture in progress cannot be waited for (illegal);
// once the capture ended it marks no work outside the graph: complete.
void check_not_captured(const std::shared_ptr<Event::Record>& rec, const char* what) {
  if (rec && rec->capture) {
    bool ended;
    {
      std::lock_guard lk(rec->capture->mu);
      ended = rec->capture->ended;
    }
    if (!ended) {
      capture_violation(rec->capture, std::string(what) + " of an event recorded in the capture");
    }
  }
}
}  // namespace

bool event_query(Event* e) {
  auto rec = checked(e).latest();
  check_not_captured(rec, "event_query");
  return !rec || rec->complete();
}

void event_synchronize(Event* e) {
  auto rec = checked(e).latest();
  check_not_captured(rec, "event_synchronize");
  if (!rec) return;
  rec->stream->wait(rec->seq);
  // The event stands for its stream's work up to the record: what that work
  // failed with (or waited for), unless the stream reported it already.
  std::vector<PendingFailure> failures;
  FailureList reporting;
  for (const auto& f : rec->failures) {
    if (f->reported_on(rec->stream)) continue;
    failures.push_back(PendingFailure{f, false});
    reporting.push_back(f);
  }
  if (failures.empty()) return;
  // Reported here, so the recording stream does not report them again.
  rec->stream->forget(reporting);
  throw_failures(std::move(failures), rec->stream->describe());
}

std::string event_pending_failure(Event* e) {
  auto rec = checked(e).latest();
  // complete() reads the stream's progress under its mutex: the marker's
  // failures are written before it completes.
  if (!rec || rec->capture || !rec->complete()) return "";
  const AsyncFailure* first = nullptr;
  for (const auto& f : rec->failures) {
    if (!f->reported_on(rec->stream) && (first == nullptr || f->order < first->order)) first = f.get();
  }
  return first == nullptr ? std::string() : first->message;
}

void event_wait(Event* e) {
  auto rec = checked(e).latest();
  if (rec && !rec->capture) rec->stream->wait(rec->seq);
}

double event_elapsed_ms(Event* start, Event* end) {
  auto a = checked(start).latest();
  auto b = checked(end).latest();
  check_not_captured(a, "event_elapsed_ms");
  check_not_captured(b, "event_elapsed_ms");
  const auto done = [](const auto& r) { return r && r->complete() && r->stamped; };
  if (!done(a) || !done(b)) {
    throw Error("Both events must be recorded and completed before calculating elapsed time");
  }
  return std::chrono::duration<double, std::milli>(b->stamp - a->stamp).count();
}

}  // namespace axon::rt
