"""The companions of `verl.protocol.DataProto`, split out of that module by concern.

`futures`: `DataProtoFuture`, `BatchData`, `WorkerCallError` and the object-ref registration of a
controller backend; `batch_ops`: padding, folding and all-gather of a DataProto's rows. Everything
public here is re-exported by `verl.protocol`, upstream's single import path for the data layer.
"""
