"""The batch a CTR net reads: its keys, shapes and padding ids, shared by the data and the models.

``datamodules.behavior`` builds these batches and ``models.ctr`` reads them; both import the ids below
from here, so the data layer does not depend on the nets.

Batch keys (produced by ``datamodules.behavior.BehaviorDataModule``; a net reads only what it
needs). Every id feature reserves 0 for padding / unknown, so a vocabulary of size ``n`` holds
ids ``0..n-1`` and real ids start at 1.

==================  ===========  ======  =====================================================
key                 shape        dtype   meaning
==================  ===========  ======  =====================================================
``user``            (B,)         long    user id (also the GAUC group)
``user_features``   (B, P)       long    user-profile fields (P may be 0), field f in [0, profile_sizes[f])
``target_item``     (B,)         long    the candidate item
``target_category`` (B,)         long    its category
``hist_items``      (B, L)       long    behaviour sequence, oldest to newest, 0 = padding
``hist_categories`` (B, L)       long    their categories, 0 = padding
``hist_positions``  (B, L)       long    bucketised t(target) - t(item) (Sec. 3.1), 0 = padding
``hist_mask``       (B, L)       bool    True where the sequence holds a real item
``label``           (B,)         float   1 = click (not read by the nets)
==================  ===========  ======  =====================================================

The padding side (left or right) is the data's choice; every net of ``models.ctr`` gives the same
output for either and for any amount of padding (tested), because padded tokens are masked, never
merely zero.
"""

PAD = 0  #: padding / unknown id in every id feature
PAD_BUCKET = 0  #: position bucket of padding
ZERO_DELTA_BUCKET = 1  #: position bucket of t(target) - t(item) = 0; the target token's own
