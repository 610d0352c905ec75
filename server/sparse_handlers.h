#pragma once
// The ps's ops on embedding tables (server/table_store.h): sparse_pull,
// sparse_push and sparse_push_pull of the rows whose sorted, unique ids a
// request carries (shared/messages.h, SparseRequest). A request whose ids
// are repeated, out of order, beyond a fixed table or homed on another ps,
// whose row width is not the table's, or whose gradients hold a NaN or an
// infinity is refused with an error naming the table and the first bad id,
// and changes nothing. Gradients may travel in bf16 or fp16 and rows leave
// in the request's dtype (net.wire_dtype), as for chunks.
//
// Rows are answered at once in every mode: the consistency policies of ssp
// and backup (server/consistency/) hold dense chunks only. An applied push
// counts as the worker's update (Coordinator::applied_update), as a chunk's
// does, so a restore's losses are told the same way.
//
// Thread rules: single-threaded, like the whole ps (server/request.h).
#include "server/coordinator.h"
#include "server/ps_stats.h"
#include "server/request.h"
#include "server/table_store.h"
#include "server/update_payload.h"

namespace pstrain::ps {

class SparseHandlers {
 public:
  SparseHandlers(TableStore& tables, Coordinator& coordinator, ReplySink& sink, PsStats& stats);

  // Registers sparse_pull, sparse_push and sparse_push_pull.
  void add_handlers(Handlers& handlers);

  // sparse_pull, and the pull half of a resent sparse_push_pull (op
  // sparse_push_pull, ids only: server/dispatcher.h).
  void pull(const Request& request);
  void push(const Request& request);  // sparse_push and sparse_push_pull

 private:
  TableStore& tables_;
  Coordinator& coordinator_;
  ReplySink& sink_;
  PsStats& stats_;
  NonfiniteRefusal nonfinite_;
};

}  // namespace pstrain::ps
